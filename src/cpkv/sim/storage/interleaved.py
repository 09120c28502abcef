"""``interleaved``: pages spread over the ranks by position (SGLang 0.5.23 ``PageInterleavePoolAllocator``;
SPEC C-STORAGE).

Position-page ``j`` of a request lives on rank ``(b + j) % C``. ``b`` is chosen when the request starts
(prefix 0): the lane with the most free pages after the batch's earlier requests took theirs, ties to
the lower lane. A request that extends pages already stored (a later chunk, a prefix-cache hit) continues
their rotation: its next page goes to the lane after the lane of its last page (SGLang: the rotation base
recorded on the cached chain). So a request's pages are exactly cyclic and every lane holds
``floor(m / C)`` or ``ceil(m / C)`` of any ``m`` consecutive ones. The group holds ``C * Q`` pages, but the
rank that stores a page is in general not the rank that computes it: every layer all-gathers the
extend's KV rows (and the cached prefix's, ``traffic.py``) so each rank can keep its own.
"""

from __future__ import annotations

import numpy as np

from ...allocator import ExtendAllocation, OwnerLaneAllocator
from ...allocator.checks import head_owners
from ...cache import PrefixCache
from ...config import CPConfig
from ...plan import BatchPlan
from ...slots import extend_slots
from ...validate import as_int_array, lengths
from ..config import SimConfig
from .allocator import StorageAllocator
from .base import KVStorage
from .compute import CPCompute, with_storage
from .traffic import prefix_gather_rows

_I64 = np.int64


def cyclic_counts(start: np.ndarray, pages: np.ndarray, cp_size: int) -> np.ndarray:
    """Pages each lane takes when ``pages[i]`` consecutive pages cycle from lane ``start[i]``: int64 ``[B, C]``,
    ``pages // C`` plus one on the first ``pages % C`` lanes from ``start``. Example C=4, start 3, 6 pages
    (lanes 3, 0, 1, 2, 3, 0): [2, 1, 1, 2]."""
    C = cp_size
    extra = (np.arange(C, dtype=_I64)[None, :] - start[:, None]) % C < (pages % C)[:, None]
    return (pages // C)[:, None] + extra


class InterleavedAllocator(StorageAllocator):
    """``StorageAllocator`` placing position-page ``j`` on lane ``(b + j) % C`` (module docstring)."""

    def plan_extend(self, prefix_lens, extend_lens, last_locs) -> BatchPlan:
        """The compute plan with each new page on its interleaved lane.

        Example C=4, P=1, Q=4 (free [3, 4, 4, 4]: lane 0 lost page 0), a batch of two fresh requests of 3 and
        2 tokens: the first starts on lane 1 (most free, lowest) and takes lanes [1, 2, 3]; the free pages
        are then [3, 3, 3, 3], so the second starts on lane 0: [0, 1].

        Raises:
            PlanError: bad lengths. AllocatorError: a ``last_loc`` not on a page held, or inconsistent with
                its ``prefix_len`` (C-FAIL-FAST; ``allocator.checks.head_owners``, naming the request).
        """
        L0, E = lengths(prefix_lens, extend_lens)
        last = as_int_array("last_locs", last_locs, L0.shape[0])
        C, P = self.config.cp_size, self.config.page_size
        head_owners(self.lanes.pool, self.config, L0, last)  # the lanes' checks of last_locs (C-FAIL-FAST)
        compute = self.compute.plan(L0, E)
        ptr = compute.page_indptr
        m = ptr[1:] - ptr[:-1]
        start = np.where(L0 > 0, (last // P + 1) % C, 0)  # the lane after the last page's
        fresh = np.flatnonzero((L0 == 0) & (m > 0))
        if fresh.shape[0]:
            counts = cyclic_counts(start, m, C)
            counts[fresh] = 0
            before = np.cumsum(counts, axis=0) - counts  # [B, C] pages the earlier continuing requests take
            free = self.lanes.free_pages_per_lane()
            taken = np.zeros(C, dtype=_I64)  # by the earlier fresh requests
            for i in fresh.tolist():
                b = int(np.argmax(free - before[i] - taken))  # the most free pages, ties to the lower lane
                start[i] = b
                taken += cyclic_counts(start[i : i + 1], m[i : i + 1], C)[0]
        j = np.arange(int(ptr[-1]), dtype=_I64) - np.repeat(ptr[:-1], m)  # new page's index in its request
        owners = (np.repeat(start, m) + j) % C
        return with_storage(compute, owners, ptr)

    def allocate(self, plan: BatchPlan, last_locs) -> ExtendAllocation:
        """One page of each of ``plan.page_owners``' lanes, in order (``alloc_pages``: atomic), then the
        slots of C-ALLOC (head tokens after ``last_loc``, then each new page's rows)."""
        pages = self.lanes.alloc_pages(plan.page_owners)
        slots = extend_slots(plan, as_int_array("last_locs", last_locs, plan.num_requests), pages)
        pages.setflags(write=False)
        return ExtendAllocation(slots, plan, pages)


class InterleavedStorage(KVStorage):
    """The ``interleaved`` design: a sharded pool of ``C`` lanes of ``Q_r`` pages of ``P`` tokens, placed by
    position (``InterleavedAllocator``); the prefix cache's unit is one page.

    Admission keeps per-lane reservations (a request's lanes are fixed by its pages' positions, so every
    lane must hold the even shares of what the admitted requests still need); the scheduler re-checks a
    plan after each eviction (``alloc.replans_after_eviction``), since a starting request's lane follows
    the free pages.
    """

    name = "interleaved"
    alloc: InterleavedAllocator
    per_lane_reservation = True

    def __init__(self, config: SimConfig, policy: str, cost) -> None:
        super().__init__(config, cost)
        C, P = config.cp_size, config.page_size
        self.lanes = OwnerLaneAllocator(
            CPConfig(C, P, policy, config.cp_strategy), list(config.lane_capacities)
        )
        self.alloc = InterleavedAllocator(self.lanes, CPCompute(C, P, config.cp_strategy))
        self.cache = PrefixCache(self.lanes, host_pages_per_lane=config.host_pages_per_lane)
        self.page_size = P

    def used_pages_per_rank(self) -> np.ndarray:
        return self.lanes.used_pages_per_lane()

    def step_traffic(self, rows, allocation: ExtendAllocation) -> float:
        plan = allocation.plan
        prefix = prefix_gather_rows(rows, plan, self.page_size, lambda pages, j: pages)
        return self.traffic.add_allgathers(plan.max_rank_tokens, prefix)

    def scratch_allocator(self) -> InterleavedAllocator:
        lanes = OwnerLaneAllocator(self.lanes.config, list(self.cfg.lane_capacities))
        return InterleavedAllocator(lanes, self.alloc.compute)
