"""``StorageAllocator``: what the scheduler allocates from under a design whose pages are not placed by
the ranks that compute them (replicated, interleaved, interleaved-vblock; SPEC C-STORAGE).

It drives the design's real ``OwnerLaneAllocator`` (its ``pool``: the pages, their lanes, every free and
load-back of the prefix cache) and answers the calls the simulator's scheduler makes of an allocator:
``plan_extend`` gives the step's compute plan with the design's new pages (``compute.with_storage``),
``allocate(plan, last_locs)`` takes exactly those pages, ``alloc_extend`` is the two in one; queries,
``free``, ``alloc_pages`` and ``release_tail`` are the pool's.
"""

from __future__ import annotations

import numpy as np

from ...allocator import ExtendAllocation, OwnerLaneAllocator
from ...config import CPConfig
from ...errors import AllocatorError
from ...plan import BatchPlan
from ...validate import as_int_array, check_int
from .compute import CPCompute

_I64 = np.int64


class StorageAllocator:
    """Base of ``OnePoolAllocator`` and ``InterleavedAllocator`` (module docstring).

    Args:
        pool: the design's ``OwnerLaneAllocator`` (its lanes and page size are the design's).
        compute: the group's ``CPCompute`` (its ``cp_strategy`` split).
        policy: the owner policy the scheduler's rules read from ``config.owner_policy`` (``balanced`` where
            placement follows free pages, so a plan is checked again after each eviction).

    Attributes:
        config: ``CPConfig(lanes, page tokens, policy, the compute's cp_strategy)`` of the storage (``cp_size`` =
            its lanes).
    """

    def __init__(self, pool: OwnerLaneAllocator, compute: CPCompute, policy: str) -> None:
        self.pool, self.compute = pool, compute
        self.config = CPConfig(pool.config.cp_size, pool.config.page_size, policy, compute.config.cp_strategy)
        self.num_pages = pool.num_pages
        self.capacity_per_lane = pool.capacity_per_lane
        self.lane_pages = pool.lane_pages

    # ------------------------------------------------------------------------------- the pool's pages
    def free_pages_per_lane(self) -> np.ndarray:
        """Free pages of each storage lane, int64 ``[lanes]``."""
        return self.pool.free_pages_per_lane()

    def used_pages_per_lane(self) -> np.ndarray:
        """Pages handed out per storage lane, int64 ``[lanes]``."""
        return self.pool.used_pages_per_lane()

    @property
    def total_free_pages(self) -> int:
        """Free pages over all storage lanes."""
        return self.pool.total_free_pages

    def is_free(self, pages) -> np.ndarray:
        """Bool ``[n]``: whether each page is free (the pool's ``is_free``)."""
        return self.pool.is_free(pages)

    def alloc_pages(self, owners) -> np.ndarray:
        """One page of each lane listed, atomically (the pool's ``alloc_pages``)."""
        return self.pool.alloc_pages(owners)

    def free(self, pages) -> None:
        """Return pages to the pool (its ``free``: all or nothing)."""
        self.pool.free(pages)

    def release_tail(self, page_ids, new_len: int) -> np.ndarray:
        """The pool's ``release_tail`` (C-DRAFT) in the design's pages."""
        return self.pool.release_tail(page_ids, new_len)

    # ----------------------------------------------------------------------------------- allocation
    def plan_extend(self, prefix_lens, extend_lens, last_locs) -> BatchPlan:
        """The compute plan of the batch with the design's new pages (nothing taken)."""
        raise NotImplementedError

    def allocate(self, plan: BatchPlan, last_locs) -> ExtendAllocation:
        """Take the new pages of ``plan`` (a ``plan_extend`` result with the pool unchanged since) and give
        every extend token its slot; ``ExtendAllocation`` whose ``plan`` is ``plan``. LaneExhausted when a
        lane is short; nothing is taken then."""
        raise NotImplementedError

    def alloc_extend(self, prefix_lens, extend_lens, last_locs) -> ExtendAllocation:
        """``allocate(plan_extend(...), last_locs)``: plan and allocate a batch at once (as the owner-lane
        allocator's ``alloc_extend``)."""
        return self.allocate(self.plan_extend(prefix_lens, extend_lens, last_locs), last_locs)

    def alloc_draft(self, seq_lens, last_locs, num_draft_tokens: int) -> ExtendAllocation:
        """``alloc_extend(seq_lens, [k] * B, last_locs)`` (C-DRAFT's rule in this design's pages)."""
        k = check_int("num_draft_tokens", num_draft_tokens, 1, error=AllocatorError)
        L0 = as_int_array("seq_lens", seq_lens)
        return self.alloc_extend(L0, np.full_like(L0, k), last_locs)
