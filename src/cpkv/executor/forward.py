"""Per-rank context-parallel prefill forward over the shared paged KV (SPEC C-LAYOUT, C-GATHER).

Rank r embeds only its own tokens (``token_owner == r``, C-OWNER-EQ-COMPUTE); per layer it writes their
K/V rows (and, for ``nsa``, index keys) into its own lane at ``write_slots``, passes the write fence, then
attends over every earlier position of the request through the rank-major view at ``read_slots`` (dense,
or indexer + top-k + sparse MLA, ``nsa.py``; under ``kv_access = local``, per-lane partials merged by the
query's owner, C-MERGE). After the last layer the gather-back all-gathers ``max_rank_tokens`` rows a rank
and indexes with ``gather_index`` (C-GATHER). Every step where a rank can fail ends in ``RankGroup.run``
(error agreement). Step by step: docs/distributed.md, "One forward on rank r".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from ..kernels import all_gather_rerange, use_kernels
from ..planner import BatchPlan
from .errors import InjectedFault
from .group import RankGroup
from .kv_buffer import KVBuffer
from .local_attention import COMM_KINDS, LocalAttention
from .model import TinyDecoder
from .nsa import nsa_attention, rank_runs
from .scheduler import ForwardBatch

KV_ACCESSES = ("shared", "local")
"""``shared``: every rank reads any lane through the rank-major view; ``local``: a rank holds only its own
lane and attention merges per-rank partials (SPEC C-MERGE)."""

LATENT, INDEX_K = "latent", "index_k"
"""Pool names: the KV (MLA latent or MHA K/V) rows, and the indexer's ``k_I`` rows (``nsa`` only)."""


def gather_back(group: RankGroup, local: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
    """Rows of every rank back in the batch's flat order (SPEC C-GATHER); collective.

    Args:
        group: the CP group.
        local: ``[n_r, d]`` this rank's rows (any dtype) in ascending flat token order.
        plan: the forward's ``BatchPlan`` (``max_rank_tokens`` M, ``gather_index``).

    Returns:
        ``[N, d]``: an all-gather of the C buffers padded to M rows, concatenated in rank order, put in flat
        order by ``all_gather_rerange`` (the Triton kernel on CUDA, C-KERNEL; ``gathered[gather_index]``
        otherwise).
    """
    gathered = group.gather_rows(local, plan.max_rank_tokens)  # [C*M, d], rank order
    return all_gather_rerange(gathered, plan)


@dataclass(frozen=True)
class WriteAudit:
    """What one rank's write of one layer changed in the whole KV buffer (``audit_writes`` mode).

    Ranks write one after another; each compares the bits of every row of every layer of a pool before
    and after its own write (one audit per pool). Direct write holds when
    ``rows_outside_lane == rows_unexpected == rows_misread == 0``: the rank changed only rows of its own
    lane, only the rows of its own tokens, and each of those reads back through ``read_slots`` as
    written; every other row, guard rows of other lanes included, kept its bits (``rows_changed`` can be
    below ``rows_written`` when a recycled page already held the same rows).

    Attributes:
        forward, layer, rank: where. pool: ``"latent"`` or ``"index_k"``.
        rows_written: tokens the rank wrote (its own tokens of the forward).
        rows_changed: rows, over all layers, whose bits changed during the rank's turn.
        rows_outside_lane: changed rows outside the rank's lane ``[r*Q*P, (r+1)*Q*P)`` or in another layer.
        rows_unexpected: changed rows other than ``read_slots(own slots)`` of this layer.
        rows_misread: own tokens whose row, read back at ``read_slots(slot)``, differs from what was written.
    """

    forward: int
    layer: int
    rank: int
    pool: str
    rows_written: int
    rows_changed: int
    rows_outside_lane: int
    rows_unexpected: int
    rows_misread: int


@dataclass(frozen=True, eq=False)
class ForwardOutput:
    """Result of one CP forward on one rank.

    Attributes:
        hidden: ``[N, hidden]`` float32 final hidden states in flat (request, position) order, the same on
            every rank (after the gather-back).
        own_tokens: extend tokens this rank computed (``per_rank_tokens[rank]``).
        audits: ``WriteAudit`` per layer and pool (empty unless ``audit_writes``).
        topk: ``nsa`` only: ``[N, layers, index_topk]`` int64 selected key positions of every token, flat
            order (gathered back like the hidden states).
        logits_elements: ``nsa`` only: ``[C, layers]`` int64 logits elements each rank materialised in each
            layer (counted on the tensors; C-ESTIMATE says it equals ``mqa_logits_elements``; under
            ``local``, ``local_logits_elements``).
        comm_bytes: ``[C, 2 * len(COMM_KINDS)]`` int64 bytes each rank sent (then received) per kind of
            exchange over all layers (``COMM_KINDS``; all zero under ``shared``).
        topk_digest: ``nsa`` under ``local``: SHA-256 of every global top-k this rank computed (checked
            equal on every rank before the forward returns).
    """

    hidden: torch.Tensor
    own_tokens: int
    audits: tuple[WriteAudit, ...]
    topk: torch.Tensor | None = None
    logits_elements: np.ndarray | None = None
    comm_bytes: np.ndarray | None = None
    topk_digest: str | None = None


class CPExecutor:
    """Runs CP prefill forwards of ``model`` on one rank of ``group`` over the KV buffer ``kv``.

    Args:
        group: this rank's ``RankGroup``.
        model: the ``TinyDecoder`` (same seed on every rank).
        kv: the group's ``KVBuffer`` (layers = ``model.config.num_layers``).
        index_kv: the index-K pool (``nsa`` models; rows ``index_head_dim`` wide, same layout as ``kv``).
        kv_access: ``"shared"`` (read any lane through the view) or ``"local"`` (pools hold the own lane
            only; attention merges per-rank partials, SPEC C-MERGE).

        audit_writes: debug: ranks write in turn and record ``WriteAudit`` (C barriers per layer).
        fault_rank: debug: this rank raises ``InjectedFault`` in layer 0's attention of every forward.

    Raises:
        ConfigError: an ``nsa`` model without ``index_kv``, a ``kv_access`` other than shared / local, a
            ``local`` access over pools that are not ``local`` buffers (or the reverse), or a bad ``CPKV_KERNELS``.
        KernelVersionError: the group's device needs Triton kernels (CUDA) and the stack is missing or old.
    """

    def __init__(
        self,
        group: RankGroup,
        model: TinyDecoder,
        kv: KVBuffer,
        *,
        index_kv: KVBuffer | None = None,
        audit_writes: bool = False,
        fault_rank: int | None = None,
        kv_access: str = "shared",
    ) -> None:
        if model.config.nsa and index_kv is None:
            raise ConfigError("attention='nsa' needs the index-K pool: pass index_kv (C-NSA)")
        self.group, self.model, self.kv = group, model, kv
        self.pools = {LATENT: kv} if index_kv is None else {LATENT: kv, INDEX_K: index_kv}
        self.audit_writes = audit_writes
        self.fault_rank = fault_rank
        if kv_access not in KV_ACCESSES:
            raise ConfigError(f"kv_access={kv_access!r} unknown; use one of {', '.join(KV_ACCESSES)}")
        if any((pool.kind == "local") != (kv_access == "local") for pool in self.pools.values()):
            raise ConfigError(
                f"kv_access={kv_access!r} with {kv.kind!r} kv_buffer: 'local' access takes a 'local' buffer "
                f"(each rank's own lane only), and 'shared' access a view of every lane"
            )
        self.local = (
            LocalAttention(group, model, kv, index_kv, self._maybe_fault) if kv_access == "local" else None
        )
        use_kernels(group.device)  # start-up gate: a bad CPKV_KERNELS or a missing kernel stack fails here

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """One CP prefill forward (collective: every rank calls it with the same ``batch``).

        Returns:
            ``ForwardOutput`` with the whole batch's final hidden states ``[N, hidden]`` in flat order.

        Raises:
            LaneWriteError: a token's slot is not in this rank's lane (on every rank).
            Any error of any rank, re-raised on every rank (``RankGroup.agree``).
        """
        g, plan, f = self.group, batch.alloc.plan, batch.index
        nsa = self.model.config.nsa
        own = np.flatnonzero(plan.token_owner == g.rank)  # [n_r] ascending flat token indices
        idx = torch.from_numpy(own).to(g.device)
        loc, pos, req = batch.out_cache_loc[idx], batch.positions[idx], batch.token_req[own]
        lp = runs = None
        local = self.local
        if local is not None:
            lp, h = g.run(
                f"forward {f}: local plan + embed",
                lambda: (local.prepare(batch), self.model.embed(batch.token_ids[idx])),
            )
        else:
            runs = g.run(f"forward {f}: position runs", rank_runs, plan, g.rank, own) if nsa else None
            h = g.run(f"forward {f}: embed", self.model.embed, batch.token_ids[idx])
        audits: list[WriteAudit] = []
        topks: list[torch.Tensor] = []
        elements: list[int] = []
        for layer in range(self.model.config.num_layers):
            where = f"forward {f} layer {layer}"
            q_own = None
            if self.audit_writes:
                x, layer_audits = self._audited_write(where, f, layer, h, pos, loc)
                audits.extend(layer_audits)
            elif self.local is not None:  # one step: the own rows into the own lane, the own queries
                x, q_own = g.run(f"{where}: K/V write + queries", self._write_kv_queries, layer, h, pos, loc)
            else:
                x = g.run(f"{where}: K/V write (write fence)", self._write_kv, layer, h, pos, loc)
            for pool in self.pools.values():
                pool.publish(g, layer)
            if self.local is not None:
                h, topk, n = self.local.layer(where, layer, h, x, lp, batch, q_own)  # type: ignore[arg-type]
                if nsa:
                    assert topk is not None  # LocalAttention.layer returns the top-k under nsa
                    topks.append(topk)
                    elements.append(n)
            elif nsa:
                h, topk, n = g.run(
                    f"{where}: sparse attention + MLP", self._sparse_mlp, layer, h, x, pos, runs, batch
                )
                topks.append(topk)
                elements.append(n)
            else:
                h = g.run(f"{where}: attention + MLP", self._attend_mlp, layer, h, x, pos, req, batch)
        out = g.run(f"forward {f}: final norm", self.model.final_norm, h)
        hidden = gather_back(g, out, plan)
        digest = None
        if self.local is not None:  # one all-gather: bytes, logits counts, top-k digests (checked equal)
            comm, counts, digest = self.local.summary(elements, f"forward {f}")
        else:
            comm = np.zeros((g.world_size, 2 * len(COMM_KINDS)), dtype=np.int64)
            if nsa:
                counts = (
                    g.gather_rows(torch.tensor([elements], dtype=torch.int64, device=g.device), 1)
                    .cpu()
                    .numpy()
                )
        if not nsa:
            return ForwardOutput(
                hidden=hidden, own_tokens=int(own.shape[0]), audits=tuple(audits), comm_bytes=comm
            )
        topk = gather_back(g, torch.stack(topks, 1).flatten(1), plan).view(hidden.shape[0], len(topks), -1)
        return ForwardOutput(
            hidden=hidden,
            own_tokens=int(own.shape[0]),
            audits=tuple(audits),
            topk=topk,
            logits_elements=counts,
            comm_bytes=comm,
            topk_digest=digest,
        )

    # ---------------------------------------------------------------------------------------- steps
    def _write_kv(self, layer: int, h: torch.Tensor, pos: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        """Attention input ``x`` of this rank's tokens, whose rows go to its own lane of each pool."""
        return self._write_rows(layer, h, pos, loc)[0]

    def _write_kv_queries(self, layer: int, h, pos, loc) -> tuple[torch.Tensor, torch.Tensor]:
        """``_write_kv`` and, under ``local``, the own tokens' packed queries (``LocalAttention.queries``)."""
        x = self._write_kv(layer, h, pos, loc)
        return x, self.local.queries(layer, x, pos)  # type: ignore[union-attr]

    def _write_rows(self, layer, h, pos, loc) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x = self.model.attn_input(layer, h)
        rows = {LATENT: self.model.kv_rows(layer, x, pos)}
        if INDEX_K in self.pools:
            rows[INDEX_K] = self.model.index_k_rows(layer, x, pos)
        for name, r in rows.items():
            self.pools[name].write(layer, loc, r)
        return x, rows

    def _sparse_mlp(
        self, layer, h, x, pos, runs, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Indexer, top-k and sparse MLA of this rank's queries (``nsa.py``), then the MLP.

        Returns ``(h [n_r, hidden], topk [n_r, index_topk], logits elements materialised)``.
        """
        self._maybe_fault(layer, batch)
        attn, topk, n = nsa_attention(
            self.model, layer, x, pos, runs, batch.kv_slots, self.kv, self.pools[INDEX_K]
        )
        h = h + attn
        return h + self.model.mlp(layer, h), topk, n

    def _maybe_fault(self, layer: int, batch: ForwardBatch) -> None:
        if self.fault_rank == self.group.rank and layer == 0:
            raise InjectedFault(self.group.rank, f"forward {batch.index} layer 0 attention")

    def _attend_mlp(self, layer, h, x, pos, req, batch: ForwardBatch) -> torch.Tensor:
        """Causal attention of this rank's queries over the shared KV, then the MLP; ``[n_r, hidden]``.

        A request's queries read the slots of positions ``0 .. max query position`` (prefix pages and
        this forward's pages of every lane) through ``read_slots``.
        """
        self._maybe_fault(layer, batch)
        attn = torch.zeros_like(x)
        for i in np.unique(req).tolist():
            sel = torch.from_numpy(np.flatnonzero(req == i)).to(x.device)
            q_pos = pos[sel]
            n_keys = int(q_pos.max()) + 1
            rows = self.kv.read(layer, batch.kv_slots[i][:n_keys])
            key_pos = torch.arange(n_keys, dtype=torch.int64, device=x.device)
            attn[sel] = self.model.attention(layer, x[sel], q_pos, rows, key_pos)
        h = h + attn
        return h + self.model.mlp(layer, h)

    def _audited_write(
        self, where: str, f: int, layer: int, h, pos, loc
    ) -> tuple[torch.Tensor, list[WriteAudit]]:
        """``_write_kv`` with the ranks taking turns, each diffing every pool around its write."""
        g = self.group
        x = None
        audits: list[WriteAudit] = []
        for turn in range(g.world_size):
            step = f"{where}: audited K/V write, turn of rank {turn}"
            if turn == g.rank:
                x, audits = g.run(step, self._audit_turn, f, layer, h, pos, loc)
            else:
                g.barrier_ok(step)
        return x, audits  # type: ignore[return-value]

    def _audit_turn(self, f: int, layer: int, h, pos, loc) -> tuple[torch.Tensor, list[WriteAudit]]:
        before = {name: pool.storage.clone() for name, pool in self.pools.items()}
        x, written = self._write_rows(layer, h, pos, loc)
        expected = set(self.kv.row_index(loc).cpu().tolist())
        audits = []
        for name, pool in self.pools.items():
            # [layers, rows]: rows whose bits changed during this rank's turn
            changed = (before[name].view(torch.int32) != pool.storage.view(torch.int32)).any(dim=-1)
            layers, rows = (t.cpu() for t in torch.nonzero(changed, as_tuple=True))
            a, b = pool.lane_rows()
            outside = (layers != layer) | (rows < a) | (rows >= b)
            unexpected = sum(
                1
                for lay, r in zip(layers.tolist(), rows.tolist(), strict=True)
                if lay != layer or r not in expected
            )
            misread = int(
                (pool.read(layer, loc).view(torch.int32) != written[name].view(torch.int32)).any(dim=-1).sum()
            )
            audits.append(
                WriteAudit(
                    f,
                    layer,
                    self.group.rank,
                    name,
                    int(loc.shape[0]),
                    int(rows.shape[0]),
                    int(outside.sum()),
                    unexpected,
                    misread,
                )
            )
        return x, audits
