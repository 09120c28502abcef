"""One run of the reference executor on one rank: a ``DistCase`` in, a ``CaseResult`` out.

A case fixes the pool (page_size, pages_per_lane, one int or one per lane), the owner policy, the CP
strategy (C-ZIGZAG or C-INTERLEAVE), the model,
the KV access (``shared`` view or ``local`` lanes, SPEC C-MERGE), the decode steps and the workload.
Every rank runs the same case: it builds the KV pools (collectively: the latent pool, and for ``nsa`` the
index-K pool with the same layout), the replicated scheduler and the executor, runs every forward (and,
at the end of each wave of the workload, the decode steps of its finished prompts, ``decode.py``), and
rank 0 compares each with the single-process reference (``TinyDecoder.reference`` over each whole
request; ``records.py``, ``decode.record_decode``).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import (
    DEFAULT_CP_STRATEGY,
    DEFAULT_OWNER_POLICY,
    DEFAULT_PAGE_SIZE,
    CPConfig,
    check_int,
    per_lane_ints,
)
from ..errors import ConfigError
from ..layout import SharedKVLayout
from .decode import DecodeRecord, run_decode
from .errors import DistError
from .forward import INDEX_K, KV_ACCESSES, LATENT, CPExecutor, WriteAudit
from .group import RankGroup
from .kv_buffer import KVBuffer, create_kv_buffer
from .model import TinyDecoder, TinyDecoderConfig
from .records import CaseResult, record_forward
from .scheduler import ReplicatedScheduler
from .workload import Workload


@dataclass(frozen=True, kw_only=True)
class DistCase:
    """What one run of the executor does (plain, picklable; the same on every rank).

    Attributes:
        workload: requests and forwards (``make_workload``).
        page_size: P, tokens per page (default ``config.DEFAULT_PAGE_SIZE``, 64, as ``cpkv plan`` and ``cpkv simulate``).
        pages_per_lane: Q, one int for every lane or C ints (ranks with unequal free memory; the shared
            layout then has ``max(Q_r)`` pages per lane and lane r uses its first Q_r); None sizes the
            pool so every request fits on one lane at once (``workload.total_pages(P) + 1``).
        policy: owner policy, ``balanced`` (default, as ``CPConfig``) / ``rotation`` / ``legacy``.
        cp_strategy: ``zigzag`` (default, C-ZIGZAG) or ``interleave`` (C-INTERLEAVE): which lane owns and
            computes each new page; set explicitly (every rank the same), never read from the environment.
        model: ``TinyDecoderConfig`` (default: MLA, 576-wide latent rows, dense attention; ``attention=
            "nsa"`` adds the indexer and its index-K pool).
        kv_buffer: ``"shm"`` / ``"mirrored"`` (``shared`` access) or ``"local"``; None: ``local`` under
            ``local`` access, else ``shm`` on CPU ranks of one host, ``mirrored`` on GPU or over several hosts.
        kv_access: ``"shared"`` (default: every rank reads any lane through the rank-major view) or
            ``"local"`` (a rank holds, writes and reads only its own lane; partials merged, SPEC C-MERGE).
        decode_steps: greedy decode steps per request after its prompt (0: prefill only).
        prefix_cache: share full pages between requests through ``PrefixCache``.
        host_pages_per_lane: host-tier pages per lane of the cache (0: evicted pages are dropped).
        check_replicas: all-gather the scheduler digest after every schedule (debug; cheap).
        audit_writes: ranks write in turn and diff every pool (debug; C barriers per layer).
        fault_rank: debug: this rank raises ``InjectedFault`` in the first forward.
        name: label for reports.
    """

    workload: Workload
    page_size: int = DEFAULT_PAGE_SIZE
    pages_per_lane: int | tuple[int, ...] | None = None
    policy: str = DEFAULT_OWNER_POLICY
    cp_strategy: str = DEFAULT_CP_STRATEGY
    model: TinyDecoderConfig = field(default_factory=TinyDecoderConfig)
    kv_buffer: str | None = None
    kv_access: str = "shared"
    decode_steps: int = 0
    prefix_cache: bool = True
    host_pages_per_lane: int = 0
    check_replicas: bool = True
    audit_writes: bool = False
    fault_rank: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.pages_per_lane, list):  # a tuple keeps the frozen case hashable
            object.__setattr__(self, "pages_per_lane", tuple(self.pages_per_lane))

    def resolved_pages_per_lane(self, cp_size: int) -> list[int]:
        """Pages of each lane actually used, ``[C]`` (pages).

        Raises:
            ConfigError: a capacity below 1, not an integer, or a list whose length is not ``cp_size``.
        """
        if self.pages_per_lane is not None:
            return per_lane_ints("pages_per_lane", self.pages_per_lane, cp_size, 1)
        P = check_int("page_size", self.page_size, 1)
        return [self.workload.total_pages(P, extra_tokens=self.decode_steps) + 1] * cp_size

    def resolved_kv_buffer(self, device: torch.device, single_host: bool = True) -> str:
        """The KV buffer kind this case runs on (see ``kv_buffer``).

        Raises:
            ConfigError: an unknown ``kv_access``, ``decode_steps`` below 0, or a buffer kind that does not
                fit the access (``local`` takes a ``local`` buffer; ``shared`` takes ``shm`` or ``mirrored``).
        """
        check_int("decode_steps", self.decode_steps, 0)
        if self.kv_access not in KV_ACCESSES:
            raise ConfigError(f"kv_access={self.kv_access!r} unknown; use one of {', '.join(KV_ACCESSES)}")
        if self.kv_access == "local":
            if self.kv_buffer not in (None, "local"):
                raise ConfigError(
                    f"kv_access='local' keeps each rank's own lane only; kv_buffer={self.kv_buffer!r} is a "
                    f"view of every lane (leave kv_buffer unset)"
                )
            return "local"
        if self.kv_buffer == "local":
            raise ConfigError(
                "kv_buffer='local' needs kv_access='local' (a rank then reads only its own lane)"
            )
        return self.kv_buffer or ("shm" if device.type == "cpu" and single_host else "mirrored")


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
    caps = group.run("case setup", case.resolved_pages_per_lane, C)
    config = group.run("case setup", CPConfig, C, P, case.policy, case.cp_strategy)
    model = group.run("build model", TinyDecoder, case.model, group.device)
    kind = group.run("case setup", case.resolved_kv_buffer, group.device, group.single_host)
    local = kind == "local"
    layout = SharedKVLayout(C, P, max(caps))
    L = case.model.num_layers
    pools = {LATENT: create_kv_buffer(group, layout, L, case.model.kv_row_width, kind=kind, tag=tag)}
    if case.model.nsa:  # same layout, pages, owners and slots as the latent pool (C-NSA)
        pools[INDEX_K] = create_kv_buffer(
            group, layout, L, case.model.index_head_dim, kind=kind, tag=f"{tag}-idx"
        )
    restored: list[int] = []
    backup, restore = host_hooks(pools, rank, restored)
    sched = ReplicatedScheduler(
        config,
        caps,
        case.workload,
        prefix_cache=case.prefix_cache,
        host_pages_per_lane=case.host_pages_per_lane,
        backup_fn=backup,
        restore_fn=restore,
        device=group.device,
        hold_prompts=case.decode_steps > 0,
    )
    executor = CPExecutor(
        group,
        model,
        pools[LATENT],
        index_kv=pools.get(INDEX_K),
        audit_writes=case.audit_writes,
        fault_rank=case.fault_rank,
        kv_access=case.kv_access,
    )
    if case.check_replicas:
        group.check_replicas(
            f"{model.weights_digest()!r}|{_workload_digest(case.workload)}", "start (weights, workload)"
        )
    reference: dict = {}
    records, written = [], []
    audits: list[WriteAudit] = []
    decodes: list[DecodeRecord] = []
    n_forwards = len(case.workload.forwards)
    held: dict[int, torch.Tensor] = {}  # decode: request id -> hidden state of its last prompt position
    for f in range(n_forwards):
        batch = group.run(f"forward {f}: schedule", sched.schedule, f)
        if case.check_replicas:
            group.check_replicas(sched.digest(), f"forward {f}: schedule")
        out = executor.forward(batch)
        audits.extend(out.audits)
        written.append(batch.out_cache_loc.cpu())
        rec = group.run(
            f"forward {f}: record + finish", _record_finish, batch, out, sched, model, reference, rank, local
        )
        records.append(rec)
        rids, ind = batch.request_ids.tolist(), batch.alloc.plan.extend_indptr
        for rid in sched.take_prompt_done():  # held for decode, with its last position's hidden state
            held[rid] = out.hidden[int(ind[rids.index(rid) + 1]) - 1]
        if held and (f in case.workload.decode_after or f == n_forwards - 1):
            first = n_forwards + case.decode_steps * len(decodes)
            dec, locs, dec_audits = run_decode(
                group,
                sched,
                executor,
                model,
                list(held),
                torch.stack(list(held.values())),
                f,
                case.decode_steps,
                first,
                local=local,
                check_replicas=case.check_replicas,
            )
            decodes.append(dec)
            written.extend(locs)
            audits.extend(dec_audits)
            group.run(f"decode {first}: release", _release, sched, list(held))
            held = {}
    intact: bool | None
    if local:  # each rank checks its own lane, the only one it holds
        intact = group.all_true(
            all(_unwritten_rows_intact(kv, written, restored, P) for kv in pools.values())
        )
        intact = intact if rank == 0 else None
    else:
        intact = (
            all(_unwritten_rows_intact(kv, written, restored, P) for kv in pools.values())
            if rank == 0
            else None
        )
    errs = [r.max_abs_err for r in [*records, *decodes] if r.max_abs_err is not None]
    return CaseResult(
        name=case.name,
        rank=rank,
        cp_size=C,
        page_size=P,
        pages_per_lane=caps,
        policy=config.owner_policy,
        kv_buffer=kind,
        attention=case.model.attention,
        forwards=records,
        audits=audits,
        max_abs_err=max(errs) if errs else None,
        unwritten_rows_intact=intact,
        lane_pages_used=_lane_pages_used(written, restored, C, P),
        cache_counters=sched.cache.counters() if sched.cache else {},
        wall_s=time.perf_counter() - t0,
        kv_access=case.kv_access,
        decodes=decodes,
        pool_rows={name: int(kv.storage.shape[1]) for name, kv in pools.items()},
        cp_strategy=config.cp_strategy,
    )


def _record_finish(batch, out, sched: ReplicatedScheduler, model, reference, rank: int, local: bool):
    """One step after a forward: its ``ForwardRecord`` (``record_forward``), then ``sched.finish``."""
    rec = record_forward(batch, out, sched, model, reference, rank, local)
    sched.finish(batch)
    return rec


def _release(sched: ReplicatedScheduler, request_ids: list[int]) -> None:
    """Decode's end: release the held requests ``request_ids`` (``ReplicatedScheduler.release``)."""
    for rid in request_ids:
        sched.release(rid)


def host_hooks(pools: dict[str, KVBuffer], rank: int, restored: list[int]):
    """Host-tier hooks ``(backup, restore)`` of the prefix cache for every pool of the case (C-RELOAD).

    A page's rows of every pool (latent and index-K alike) are copied to, and restored from, its owner
    rank's memory only: ``backup(page)`` returns ``{pool: [layers, P, W] CPU tensor}`` on the owner and
    None elsewhere; ``restore(page, payload)`` writes them back into the owner's lane (the page may have
    a new id on the same lane) and records the page id in ``restored``.

    Raises (from ``restore``): DistError: the owner rank has no host copy of the page.
    """
    layout = next(iter(pools.values())).layout
    C, P = layout.cp_size, layout.page_size

    def page_slots(page: int, device) -> torch.Tensor:
        return torch.arange(page * P, (page + 1) * P, dtype=torch.int64, device=device)

    def backup(page: int):
        if page % C != rank:
            return None  # host copies are sharded by owner (C-RELOAD)
        return {
            name: kv.storage[:, kv.row_index(page_slots(page, kv.storage.device))].to("cpu", copy=True)
            for name, kv in pools.items()
        }

    def restore(page: int, payload) -> None:
        restored.append(page)
        if page % C != rank:
            return
        if payload is None:
            raise DistError(
                f"load-back of page {page} on lane {rank}: this owner rank holds no host copy (C-RELOAD)"
            )
        for name, kv in pools.items():
            for layer in range(kv.num_layers):
                kv.write(
                    layer, page_slots(page, kv.storage.device), payload[name][layer].to(kv.storage.device)
                )

    return backup, restore


def _unwritten_rows_intact(kv: KVBuffer, written: list[torch.Tensor], restored: list[int], P: int) -> bool:
    """Whether every row of ``kv`` that holds none of the written slots still holds the NaN guard bits."""
    slots = written + [torch.arange(p * P, (p + 1) * P) for p in restored]
    used = torch.zeros(kv.storage.shape[1], dtype=torch.bool)
    if slots:
        used[kv.held_rows(torch.cat(slots))] = True
    guard = kv.storage[:, ~used.to(kv.storage.device)]
    nan_bits = torch.tensor(float("nan"), dtype=torch.float32).view(torch.int32).item()
    return bool((guard.view(torch.int32) == nan_bits).all())


def _lane_pages_used(written: list[torch.Tensor], restored: list[int], C: int, P: int) -> list[int]:
    """Per lane, 1 + the highest local page index (``page // C``) any written or restored slot reached."""
    pages = torch.cat([w // P for w in written] + [torch.tensor(restored, dtype=torch.int64)]).numpy()
    out = np.zeros(C, dtype=np.int64)
    np.maximum.at(out, pages % C, pages // C + 1)
    return out.tolist()


def _workload_digest(workload: Workload) -> str:
    return hashlib.sha256(repr(workload).encode()).hexdigest()
