"""What a case reports: one ``ForwardRecord`` per forward, one ``CaseResult`` per case and rank.

``record_forward`` builds a forward's record on every rank; rank 0 also compares the gathered hidden
states (and, for ``nsa``, every layer's top-k rows) with the single-process reference of each request,
computed once per request (``TinyDecoder.reference``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from ..estimator import mqa_logits_elements
from .forward import ForwardOutput, WriteAudit
from .local_attention import COMM_KINDS, local_logits_elements
from .model import Reference, TinyDecoder
from .scheduler import ForwardBatch, ReplicatedScheduler


@dataclass(frozen=True, eq=False)
class ForwardRecord:
    """One forward as one rank saw it.

    Attributes:
        index: forward number. request_ids, prefix_lens, extend_lens: ``[B]`` lists (tokens).
        cache_hit_tokens: ``[B]`` tokens the prefix cache supplied on a request's first forward (else 0).
        phases: ``[B]`` owner phase of each request. head_owners: ``[B]`` lane of each request's
            ``last_loc`` page (-1: none). per_rank_tokens: ``[C]`` extend tokens per rank.
        max_rank_tokens: M of the gather-back. own_tokens: tokens this rank computed.
        hidden: rank 0 only: ``[N, hidden]`` float32 gathered final hidden states, flat order.
        max_abs_err: rank 0 only: max |hidden - reference| over the forward's tokens.
        topk: ``nsa``, rank 0: ``[N, layers, index_topk]`` int64 gathered selected positions, flat order.
        logits_measured: ``nsa`` only: ``[C][layers]`` logits elements each rank materialised per layer.
        logits_estimated: ``nsa`` only: ``[C]`` ``mqa_logits_elements`` of the forward's plan.
        topk_rows: ``nsa``, rank 0: rows compared with the reference (tokens x layers).
        topk_mismatched: ``nsa``, rank 0: rows whose selected positions differ from the reference.
        topk_near_tie: ``nsa``, rank 0: of those, rows where the reference's k-th and (k+1)-th logits are
            within 1e-6 relative (allowed by C-NSA).
        comm_bytes: ``{kind: {"sent": [C], "recv": [C]}}`` bytes each rank exchanged over all layers, per
            kind of ``COMM_KINDS`` (all zero under ``shared``).
        page_lanes: ``[B]`` lists, the lane of each page of each request's ``kv_slots`` (prefix and extend).
        topk_digest: ``nsa`` under ``local``: this rank's SHA-256 of the forward's global top-k rows.
    """

    index: int
    request_ids: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    cache_hit_tokens: list[int]
    phases: list[int]
    head_owners: list[int]
    per_rank_tokens: list[int]
    max_rank_tokens: int
    own_tokens: int
    hidden: np.ndarray | None = None
    max_abs_err: float | None = None
    topk: np.ndarray | None = None
    logits_measured: list[list[int]] | None = None
    logits_estimated: list[int] | None = None
    topk_rows: int | None = None
    topk_mismatched: int | None = None
    topk_near_tie: int | None = None
    comm_bytes: dict | None = None
    page_lanes: list[list[int]] | None = None
    topk_digest: str | None = None

    @property
    def logits_match(self) -> bool | None:
        """``nsa``: every rank's count equals its estimate in every layer (None for dense attention)."""
        if self.logits_measured is None or self.logits_estimated is None:
            return None
        return all(
            m == est
            for row, est in zip(self.logits_measured, self.logits_estimated, strict=True)
            for m in row
        )


@dataclass(frozen=True, eq=False)
class CaseResult:
    """A case's result on one rank.

    Attributes:
        name, rank, cp_size, page_size, policy, kv_buffer, attention, cp_strategy: what ran.
        pages_per_lane: ``[C]`` pages of each lane (Q_r; the shared layout has ``max`` of them).
        forwards: ``ForwardRecord`` per forward.
        audits: ``WriteAudit`` per forward, layer and pool (``audit_writes`` only).
        max_abs_err: rank 0 only: max over forwards and decode steps (None elsewhere).
        unwritten_rows_intact: rank 0 only: every row of every pool that no token and no load-back wrote
            still holds its NaN guard bits (None elsewhere).
        lane_pages_used: ``[C]`` highest local page index + 1 that any written slot reached on each lane
            (<= ``pages_per_lane[r]``).
        cache_counters: the prefix cache's counters (empty without a cache).
        wall_s: seconds the case took on this rank.
        kv_access: ``"shared"`` or ``"local"`` (SPEC C-MERGE).
        decodes: ``DecodeRecord`` per decode batch (``DistCase.decode_steps > 0``).
        pool_rows: rows per layer this rank's storage holds, per pool (``C*Q*P`` for a view of every lane,
            ``Q*P`` under ``local``: one lane).
    """

    name: str
    rank: int
    cp_size: int
    page_size: int
    pages_per_lane: list[int]
    policy: str
    kv_buffer: str
    attention: str
    forwards: list[ForwardRecord]
    audits: list[WriteAudit]
    max_abs_err: float | None
    unwritten_rows_intact: bool | None
    lane_pages_used: list[int]
    cache_counters: dict
    wall_s: float
    kv_access: str = "shared"
    decodes: list = field(default_factory=list)
    pool_rows: dict = field(default_factory=dict)
    cp_strategy: str = "zigzag"

    @property
    def per_rank_tokens(self) -> list[int]:
        """Extend tokens per rank summed over the forwards, ``[C]``."""
        total = np.sum([f.per_rank_tokens for f in self.forwards], axis=0, dtype=np.int64)  # [C]
        return cast("list[int]", total.tolist())

    @property
    def logits_match(self) -> bool | None:
        """``nsa``: measured == estimated logits elements on every forward and decode step, rank and layer
        (else None)."""
        flags = [f.logits_match for f in [*self.forwards, *self.decodes]]
        return None if not flags or flags[0] is None else all(flags)

    @property
    def tokens_match(self) -> bool | None:
        """Rank 0: every decoded token equals the reference's greedy choice (None without decode steps)."""
        return all(d.tokens_match for d in self.decodes) if self.decodes and self.rank == 0 else None

    def topk_counts(self) -> tuple[int, int, int]:
        """Rank 0, ``nsa``: ``(rows compared, rows differing, of which near ties)`` over all forwards and
        decode steps."""
        fs = [f for f in [*self.forwards, *self.decodes] if f.topk_rows is not None]
        return (
            sum(f.topk_rows for f in fs),
            sum(f.topk_mismatched for f in fs),
            sum(f.topk_near_tie for f in fs),
        )

    def hidden(self) -> np.ndarray:
        """Rank 0: every forward's hidden states stacked in forward order, ``[sum N, hidden]``."""
        return np.concatenate([f.hidden for f in self.forwards if f.hidden is not None])


def record_forward(
    batch: ForwardBatch,
    out: ForwardOutput,
    sched: ReplicatedScheduler,
    model: TinyDecoder,
    reference: dict[int, Reference],
    rank: int,
    local: bool = False,
) -> ForwardRecord:
    """The ``ForwardRecord`` of one forward; on rank 0 with the comparison against the reference.

    ``reference`` caches each request's ``Reference`` (computed on first use, on rank 0 only); ``local``:
    the forward ran under ``kv_access = local`` (the logits estimate is ``local_logits_elements``).
    """
    plan = batch.alloc.plan
    rids = batch.request_ids.tolist()
    L0, E = plan.prefix_lens.tolist(), plan.extend_lens.tolist()
    hits = [
        sched.cache_hit_tokens[r] if L0[i] == sched.cache_hit_tokens[r] else 0 for i, r in enumerate(rids)
    ]
    nsa = out.logits_elements is not None
    extra: dict = {}
    if nsa:
        extra["logits_measured"] = out.logits_elements.tolist()  # type: ignore[union-attr]
        extra["logits_estimated"] = logits_estimate(batch, local).tolist()
    if rank == 0:
        refs = []
        for rid, l0, e in zip(rids, L0, E, strict=True):
            if rid not in reference:
                ids = torch.tensor(sched.workload.requests[rid])
                reference[rid] = _to_cpu(model.reference(ids))
            refs.append((reference[rid], slice(l0, l0 + e)))
        hidden = out.hidden.detach().cpu()
        expected = torch.cat([ref.hidden[s] for ref, s in refs])
        extra["hidden"] = hidden.numpy()
        extra["max_abs_err"] = float((hidden - expected).abs().max()) if expected.numel() else 0.0
        if nsa:
            topk = out.topk.cpu()  # type: ignore[union-attr]
            extra["topk"] = topk.numpy()
            differs = (topk != torch.cat([ref.topk[s] for ref, s in refs])).any(-1)  # type: ignore[index]
            tied = torch.cat([ref.near_tie[s] for ref, s in refs])  # type: ignore[index]
            extra.update(
                topk_rows=int(differs.numel()),
                topk_mismatched=int(differs.sum()),
                topk_near_tie=int((differs & tied).sum()),
            )
    return ForwardRecord(
        index=batch.index,
        request_ids=rids,
        prefix_lens=L0,
        extend_lens=E,
        cache_hit_tokens=hits,
        phases=plan.request_phases.tolist(),
        head_owners=plan.head_owners.tolist(),
        per_rank_tokens=plan.per_rank_tokens.tolist(),
        max_rank_tokens=plan.max_rank_tokens,
        own_tokens=out.own_tokens,
        comm_bytes=comm_dict(out.comm_bytes),
        topk_digest=out.topk_digest,
        page_lanes=[
            ((s[:: plan.config.page_size] // plan.config.page_size) % plan.config.cp_size).tolist()
            for s in (t.cpu().numpy() for t in batch.kv_slots)
        ],
        **extra,
    )


def logits_estimate(batch: ForwardBatch, local: bool) -> np.ndarray:
    """Predicted index-logits elements per rank of one forward, int64 ``[C]``: ``mqa_logits_elements``
    (C-ESTIMATE, ``shared``) or ``local_logits_elements`` (``local``)."""
    plan = batch.alloc.plan
    if local:
        return local_logits_elements(plan, batch.kv_slots, plan.config.cp_size, plan.config.page_size)
    return mqa_logits_elements(plan)


def comm_dict(comm_bytes: np.ndarray | None) -> dict | None:
    """``[C, 2K]`` sent-then-received bytes -> ``{kind: {"sent": [C], "recv": [C]}}`` (``COMM_KINDS``)."""
    if comm_bytes is None:
        return None
    K = len(COMM_KINDS)
    return {
        kind: {"sent": comm_bytes[:, k].tolist(), "recv": comm_bytes[:, K + k].tolist()}
        for k, kind in enumerate(COMM_KINDS)
    }


def _to_cpu(ref: Reference) -> Reference:
    return Reference(
        ref.hidden.cpu(),
        None if ref.topk is None else ref.topk.cpu(),
        None if ref.near_tie is None else ref.near_tie.cpu(),
    )
