"""One run of the reference executor on one rank: a ``DistCase`` in, a ``CaseResult`` out.

A case fixes the pool (page_size, pages_per_lane), the owner policy, the model and the workload. Every
rank runs the same case: it builds the KV buffer (collectively), the replicated scheduler and the
executor, runs every forward, and rank 0 compares each forward's gathered hidden states with the
single-process reference (``TinyDecoder.reference_forward`` over each whole request).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import CPConfig, check_int
from ..layout import SharedKVLayout
from .errors import DistError
from .forward import CPExecutor, WriteAudit
from .group import RankGroup
from .kv_buffer import KVBuffer, create_kv_buffer
from .model import TinyDecoder, TinyDecoderConfig
from .scheduler import ReplicatedScheduler
from .workload import Workload


@dataclass(frozen=True, kw_only=True)
class DistCase:
    """What one run of the executor does (plain, picklable; the same on every rank).

    Attributes:
        workload: requests and forwards (``make_workload``).
        page_size: P, tokens per page (default 16).
        pages_per_lane: Q; None sizes the pool so every request fits on one lane at once
            (``workload.total_pages(P) + 1``), i.e. no policy can run out.
        policy: owner policy, ``rotation`` / ``legacy`` / ``balanced``.
        model: ``TinyDecoderConfig`` (default: MLA, 576-wide latent rows).
        kv_storage: ``"shm"`` / ``"replicated"``; None: ``shm`` on CPU, ``replicated`` on GPU.
        prefix_cache: share full pages between requests through ``PrefixCache``.
        host_pages_per_lane: host-tier pages per lane of the cache (0: evicted pages are dropped).
        check_replicas: all-gather the scheduler digest after every schedule (debug; cheap).
        audit_writes: ranks write in turn and diff the whole buffer (debug; C barriers per layer).
        fault_rank: debug: this rank raises ``InjectedFault`` in the first forward.
        name: label for reports.
    """

    workload: Workload
    page_size: int = 16
    pages_per_lane: int | None = None
    policy: str = "rotation"
    model: TinyDecoderConfig = field(default_factory=TinyDecoderConfig)
    kv_storage: str | None = None
    prefix_cache: bool = True
    host_pages_per_lane: int = 0
    check_replicas: bool = True
    audit_writes: bool = False
    fault_rank: int | None = None
    name: str = ""

    def resolved_pages_per_lane(self) -> int:
        """Q actually used, in pages."""
        if self.pages_per_lane is not None:
            return check_int("pages_per_lane", self.pages_per_lane, 1)
        return self.workload.total_pages(check_int("page_size", self.page_size, 1)) + 1


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


@dataclass(frozen=True, eq=False)
class CaseResult:
    """A case's result on one rank.

    Attributes:
        name, rank, cp_size, page_size, pages_per_lane, policy, kv_storage: what ran.
        forwards: ``ForwardRecord`` per forward.
        audits: ``WriteAudit`` per forward and layer (``audit_writes`` only).
        max_abs_err: rank 0 only: max over forwards (None elsewhere).
        unwritten_rows_intact: rank 0 only: every buffer row that no token and no load-back wrote still
            holds its NaN guard bits (None elsewhere).
        cache_counters: the prefix cache's counters (empty without a cache).
        wall_s: seconds the case took on this rank.
    """

    name: str
    rank: int
    cp_size: int
    page_size: int
    pages_per_lane: int
    policy: str
    kv_storage: str
    forwards: list[ForwardRecord]
    audits: list[WriteAudit]
    max_abs_err: float | None
    unwritten_rows_intact: bool | None
    cache_counters: dict
    wall_s: float

    @property
    def per_rank_tokens(self) -> list[int]:
        """Extend tokens per rank summed over the forwards, ``[C]``."""
        return np.sum([f.per_rank_tokens for f in self.forwards], axis=0, dtype=np.int64).tolist()

    def hidden(self) -> np.ndarray:
        """Rank 0: every forward's hidden states stacked in forward order, ``[sum N, hidden]``."""
        return np.concatenate([f.hidden for f in self.forwards if f.hidden is not None])


def run_cases(group: RankGroup, cases: list[DistCase], tag: str) -> list[CaseResult]:
    """Run ``cases`` one after another on this rank (collective). ``tag`` names the shm files uniquely."""
    return [run_case(group, case, tag=f"{tag}-c{k}") for k, case in enumerate(cases)]


def run_case(group: RankGroup, case: DistCase, *, tag: str) -> CaseResult:
    """Run one case on this rank (collective: every rank of ``group`` calls it with the same case).

    Raises:
        ConfigError / PlanError: a bad case (on every rank). LaneExhausted: the pool is too small.
        ReplicaDivergence: ranks disagree on scheduler state. Any rank's error, on every rank.
    """
    t0 = time.perf_counter()
    C, P, rank = group.world_size, case.page_size, group.rank
    Q = group.run("case setup", case.resolved_pages_per_lane)
    config = group.run("case setup", CPConfig, C, P, case.policy)
    model = group.run("build model", TinyDecoder, case.model, group.device)
    kind = case.kv_storage or ("shm" if group.device.type == "cpu" else "replicated")
    kv = create_kv_buffer(group, SharedKVLayout(C, P, Q), case.model.num_layers, case.model.kv_row_width,
                          kind=kind, tag=tag)  # fmt: skip
    restored: list[int] = []
    backup, restore = _host_hooks(kv, rank, restored)
    sched = ReplicatedScheduler(config, Q, case.workload, prefix_cache=case.prefix_cache,
                                host_pages_per_lane=case.host_pages_per_lane, backup_fn=backup,
                                restore_fn=restore, device=group.device)  # fmt: skip
    executor = CPExecutor(group, model, kv, audit_writes=case.audit_writes, fault_rank=case.fault_rank)
    if case.check_replicas:
        group.check_replicas(
            f"{model.weights_digest()!r}|{_workload_digest(case.workload)}", "start (weights, workload)"
        )
    reference: dict[int, torch.Tensor] = {}
    records, audits, written = [], [], []
    for f in range(len(case.workload.forwards)):
        batch = group.run(f"forward {f}: schedule", sched.schedule, f)
        if case.check_replicas:
            group.check_replicas(sched.digest(), f"forward {f}: schedule")
        out = executor.forward(batch)
        audits.extend(out.audits)
        written.append(batch.out_cache_loc)
        records.append(group.run(f"forward {f}: record", _record, batch, out, sched, model, reference, rank))
        group.run(f"forward {f}: finish", sched.finish, batch)
    intact = _unwritten_rows_intact(kv, written, restored, P) if rank == 0 else None
    errs = [r.max_abs_err for r in records if r.max_abs_err is not None]
    return CaseResult(
        name=case.name, rank=rank, cp_size=C, page_size=P, pages_per_lane=Q, policy=config.owner_policy,
        kv_storage=kind, forwards=records, audits=audits, max_abs_err=max(errs) if errs else None,
        unwritten_rows_intact=intact, cache_counters=sched.cache.counters() if sched.cache else {},
        wall_s=time.perf_counter() - t0,
    )  # fmt: skip


def _record(
    batch, out, sched: ReplicatedScheduler, model: TinyDecoder, reference: dict, rank: int
) -> ForwardRecord:
    plan = batch.alloc.plan
    rids = batch.request_ids.tolist()
    L0, E = plan.prefix_lens.tolist(), plan.extend_lens.tolist()
    hits = [
        sched.cache_hit_tokens[r] if L0[i] == sched.cache_hit_tokens[r] else 0 for i, r in enumerate(rids)
    ]
    hidden = err = None
    if rank == 0:
        hidden = out.hidden.detach().cpu().numpy()
        expected = []
        for rid, l0, e in zip(rids, L0, E, strict=True):
            if rid not in reference:
                reference[rid] = model.reference_forward(torch.tensor(sched.workload.requests[rid])).cpu()
            expected.append(reference[rid][l0 : l0 + e])
        err = float((out.hidden.cpu() - torch.cat(expected)).abs().max()) if expected else 0.0
    return ForwardRecord(
        index=batch.index, request_ids=rids, prefix_lens=L0, extend_lens=E, cache_hit_tokens=hits,
        phases=plan.request_phases.tolist(), head_owners=plan.head_owners.tolist(),
        per_rank_tokens=plan.per_rank_tokens.tolist(), max_rank_tokens=plan.max_rank_tokens, own_tokens=out.own_tokens, hidden=hidden, max_abs_err=err,
    )  # fmt: skip


def _host_hooks(kv: KVBuffer, rank: int, restored: list[int]):
    """Host-tier hooks: a page's rows are copied to, and restored from, its owner rank's memory only."""
    layout = kv.layout
    C, P = layout.cp_size, layout.page_size

    def page_slots(page: int) -> torch.Tensor:
        return torch.arange(page * P, (page + 1) * P, dtype=torch.int64, device=kv.storage.device)

    def backup(page: int):
        if page % C != rank:
            return None  # host copies are sharded by owner (C-RELOAD)
        return kv.storage[:, layout.read_slots(page_slots(page))].to("cpu", copy=True)  # [layers, P, W]

    def restore(page: int, payload) -> None:
        restored.append(page)
        if page % C != rank:
            return
        if payload is None:
            raise DistError(
                f"load-back of page {page} on lane {rank}: this owner rank holds no host copy (C-RELOAD)"
            )
        for layer in range(kv.num_layers):
            kv.write(layer, page_slots(page), payload[layer].to(kv.storage.device))

    return backup, restore


def _unwritten_rows_intact(kv: KVBuffer, written: list[torch.Tensor], restored: list[int], P: int) -> bool:
    """Whether every row outside ``read_slots`` of the written slots still holds the NaN guard bits."""
    slots = [w.cpu() for w in written] + [torch.arange(p * P, (p + 1) * P) for p in restored]
    used = torch.zeros(kv.storage.shape[1], dtype=torch.bool)
    if slots:
        used[kv.layout.read_slots(torch.cat(slots))] = True
    guard = kv.storage[:, ~used.to(kv.storage.device)]
    nan_bits = torch.tensor(float("nan"), dtype=torch.float32).view(torch.int32).item()
    return bool((guard.view(torch.int32) == nan_bits).all())


def _workload_digest(workload: Workload) -> str:
    return hashlib.sha256(repr(workload).encode()).hexdigest()
