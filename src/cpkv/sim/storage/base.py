"""The interface the simulator's engine drives a KV storage design through (SPEC C-STORAGE).

A design builds the group's allocator and prefix cache (the real ``OwnerLaneAllocator`` and
``PrefixCache``, in the design's own pages), says how many tokens a page holds, whether admission keeps
per-lane reservations for its placement, how many pages each rank's memory holds, and what KV each
prefill step moves between ranks. The engine calls, per replay:

- ``alloc`` / ``cache``: what the scheduler allocates from (a ``PageAllocator``) and matches in.
  ``alloc.plan_extend`` and ``alloc_extend`` give the step's compute plan (C-ZIGZAG over the C ranks) whose
  ``page_owners`` / ``page_indptr`` are the design's new pages (``compute.with_storage``);
- ``page_size``: tokens per page of ``alloc`` (every page count of admission is in these pages);
- ``per_lane_reservation``: whether admission keeps every lane's even shares of what the admitted
  requests still need (``reservation_short(..., per_lane=...)``), or the total only; ``policy``: the owner
  policy named in rejection messages (``reservation_policy`` of that flag, or owner-lane's own);
- ``step_traffic(rows, allocation)`` once per prefill step: counts its KV traffic, returns the ms the
  step waits for it (added to the step);
- ``used_pages_per_rank()`` after each step (the report's lane figures);
- ``scratch_allocator()`` when nothing advanced (``reservation.stuck_alone``); ``admitted(run)`` / ``retired(run, n)`` at admission and
  when a request hands its prompt to the cache (``prefill_tokens_recomputed``);
- ``metrics(counters)`` for the report.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...allocator import ExtendAllocation
from ...allocator.protocol import PageAllocator
from ...cache.prefix_cache import PrefixCache
from ..config import SimConfig
from ..reservation import reservation_policy
from .recompute import RecomputeCounter
from .traffic import KVTraffic


class KVStorage:
    """Base of the four designs (``owner_lane``, ``replicated``, ``interleaved``, ``vblock``).

    Args:
        config: the group. cost: the run's ``StepCost`` (prices the traffic, ``traffic.KVTraffic``).

    Subclasses set ``name``, ``per_lane_reservation``, ``alloc``, ``cache``, ``page_size``, ``pages_per_unit``
    (pages of P tokens per page of ``alloc``) and implement ``used_pages_per_rank``, ``step_traffic`` and
    ``scratch_allocator``.
    """

    name = ""
    pages_per_unit = 1
    per_lane_reservation = True
    alloc: PageAllocator
    cache: PrefixCache
    page_size: int

    def __init__(self, config: SimConfig, cost) -> None:
        self.policy = reservation_policy(self.per_lane_reservation)
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

    def scratch_allocator(self) -> PageAllocator:
        """A fresh allocator of this design with the same lanes, nothing taken (``reservation.stuck_alone``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ hooks
    def admitted(self, run) -> None:
        """A request was admitted with ``run.kv.length`` prompt tokens from the cache (``RunningRequest``)."""
        self.recompute.admitted(run.req, run.kv.length)

    def retired(self, run, n: int) -> None:
        """A request handed its first ``n`` prompt tokens to the cache."""
        self.recompute.retired(run.req, n)

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
