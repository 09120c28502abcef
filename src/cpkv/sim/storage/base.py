"""The interface the simulator's engine drives a KV storage design through (SPEC C-STORAGE).

A design builds the group's allocator and prefix cache (the real ``OwnerLaneAllocator`` and
``PrefixCache``, in the design's own pages), says how many tokens a page holds, which owner policy's
admission rules hold for its placement, how many pages each rank's memory holds, and what KV each
prefill step moves between ranks. The engine calls, per replay:

- ``alloc`` / ``cache``: what the scheduler allocates from and matches in. ``alloc.plan_extend`` and
  ``alloc_extend`` give the step's compute plan (C-ZIGZAG over the C ranks) whose ``page_owners`` /
  ``page_indptr`` are the design's new pages (``compute.with_storage``);
- ``page_size``: tokens per page of ``alloc`` (every page count of admission is in these pages);
- ``policy``: the owner policy whose admission rules the engine applies (per-lane reservations or not);
- ``step_traffic(rows, allocation)`` once per prefill step: counts its KV traffic, returns the ms the
  step waits for it (added to the step);
- ``used_pages_per_rank()`` after each step (the report's lane figures);
- ``stuck_alone(...)`` when nothing advanced; ``admitted(run)`` / ``retired(run, n)`` at admission and
  when a request hands its prompt to the cache (``prefill_tokens_recomputed``);
- ``metrics(counters)`` for the report.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...allocator import ExtendAllocation
from ..config import SimConfig
from .recompute import RecomputeCounter
from .traffic import KVTraffic

_I64 = np.int64


class KVStorage:
    """Base of the four designs (``owner_lane``, ``replicated``, ``interleaved``, ``vblock``).

    Args:
        config: the group. cost: the run's ``StepCost`` (prices the traffic, ``traffic.KVTraffic``).

    Subclasses set ``name``, ``alloc``, ``cache``, ``page_size``, ``policy``, ``pages_per_unit`` (pages of
    P tokens per page of ``alloc``) and implement ``used_pages_per_rank``, ``step_traffic`` and
    ``scratch_allocator`` (or ``stuck_alone`` itself).
    """

    name = ""
    pages_per_unit = 1

    def __init__(self, config: SimConfig, cost) -> None:
        self.cfg = config
        self.cp_size = config.cp_size
        self.traffic = KVTraffic(cost, config.cp_size)
        self.recompute = RecomputeCounter(config.page_size)

    @property
    def label(self) -> str:
        """The replay's name in a report: the owner policy under owner-lane, else the design's name."""
        return self.name

    # ------------------------------------------------------------------------------------- per design
    def used_pages_per_rank(self) -> np.ndarray:
        """Device pages of P tokens in use in each rank's memory after a step, int64 ``[C]``."""
        raise NotImplementedError

    def capacity_tokens(self) -> int:
        """Tokens of KV the group's device pool can hold (every usable page, page 0 reserved)."""
        return int(self.alloc.capacity_per_lane.sum()) * self.page_size

    def step_traffic(self, rows: Sequence[np.ndarray], allocation: ExtendAllocation) -> float:
        """Count one prefill step's KV traffic (``rows``: each request's ``req_to_token`` row, its prefix
        slots set; ``allocation``: the step's); returns the ms every rank waits for it."""
        raise NotImplementedError

    def stuck_alone(self, held_pages: np.ndarray, prefix_len: int, last_page: int, extend_len: int) -> int:
        """The lane that blocks a request's next ``extend_len`` tokens even with every other page free, or
        -1 (``admission.stuck_alone`` with this design's placement)."""
        scratch = self.scratch_allocator()
        lanes = scratch.config.cp_size
        pages = scratch.alloc_pages(np.asarray(held_pages, dtype=_I64) % lanes)
        last = -1
        if prefix_len:
            where = int(np.flatnonzero(np.asarray(held_pages) == last_page)[0])
            last = int(pages[where]) * self.page_size + (prefix_len - 1) % self.page_size
        plan = scratch.plan_extend([prefix_len], [extend_len], [last])
        short = np.bincount(plan.page_owners, minlength=lanes) - scratch.free_pages_per_lane()
        return int(np.argmax(short)) if (short > 0).any() else -1

    def scratch_allocator(self):
        """A fresh allocator of this design with the same pool (for ``stuck_alone``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ hooks
    def admitted(self, run) -> None:
        """A request was admitted with ``run.kv.length`` prompt tokens from the cache (``RunningRequest``)."""
        self.recompute.admitted(run.req.req_id, run.token_ids, run.kv.length)

    def retired(self, run, n: int) -> None:
        """A request handed its first ``n`` prompt tokens to the cache."""
        self.recompute.retired(run.req.req_id, run.token_ids, n)

    # ---------------------------------------------------------------------------------------- report
    def metrics(self, counters) -> dict:
        """The design's report fields of one replay (the ``STORAGE`` metrics of ``sim.metrics.METRICS``;
        docs/metrics.md); ``counters``: the replay's ``ReplayCounters``."""
        t = self.traffic
        hits, computed = counters.cache_hit_tokens, counters.prefill_tokens
        return {
            "kv_storage": self.name,
            "kv_capacity_tokens": self.capacity_tokens(),
            "cache_hit_rate": hits / (hits + computed) if hits + computed else None,
            "prefill_tokens_recomputed": self.recompute.tokens,
            "kv_allgather_bytes_per_rank": int(t.allgather_bytes),
            "kv_remote_read_bytes_per_rank": int(t.read_bytes.max()),
            "kv_comm_ms": t.comm_ms,
            "kv_comm_exposed_ms": t.exposed_ms,
        }
