"""``StorageAllocator``: what the scheduler allocates from under a design whose pages are not placed by
the ranks that compute them (replicated, interleaved, interleaved-vblock; SPEC C-STORAGE).

It drives the design's real ``OwnerLaneAllocator`` (its ``lanes``: the pages, their lanes, every free and
load-back of the prefix cache) and implements ``allocator.protocol.PageAllocator``, the calls the simulator's
scheduler makes: ``plan_extend`` gives the step's compute plan with the design's new pages
(``compute.with_storage``), ``allocate(plan, last_locs)`` takes exactly those pages, ``alloc_extend`` is the
two in one, ``alloc_draft`` is ``alloc_extend`` with ``k`` tokens each; queries, ``free``, ``alloc_pages``
and ``release_tail`` are the lanes'.
"""

from __future__ import annotations

import numpy as np

from ...allocator import ExtendAllocation, OwnerLaneAllocator
from ...allocator.checks import draft_lengths
from ...config import CPConfig
from ...plan import BatchPlan
from .compute import CPCompute


class StorageAllocator:
    """Base of ``OnePoolAllocator`` and ``InterleavedAllocator`` (module docstring); a ``PageAllocator``.

    Args:
        lanes: the design's ``OwnerLaneAllocator`` (its lanes and page size are the design's).
        compute: the group's ``CPCompute`` (its ``cp_strategy`` split).

    Attributes:
        replans_after_eviction: True: the placement reads the free pages (the lowest free page ids of the
            one pool; interleaved's starting lane), so the scheduler plans a batch again after each eviction.
    """

    replans_after_eviction = True

    def __init__(self, lanes: OwnerLaneAllocator, compute: CPCompute) -> None:
        self.lanes, self.compute = lanes, compute
        self.num_pages = lanes.num_pages
        self.capacity_per_lane = lanes.capacity_per_lane
        self.lane_pages = lanes.lane_pages

    @property
    def config(self) -> CPConfig:
        """The lanes' ``CPConfig``: ``cp_size`` lanes of ``page_size`` tokens, the group's ``cp_strategy``."""
        return self.lanes.config

    @property
    def page_size(self) -> int:
        """Tokens per page of the lanes (P, or a virtual block's ``P * C``)."""
        return self.lanes.page_size

    def plan_current(self, plan, last_locs) -> bool:
        """False: the design's placement follows the free page ids, so a plan is made again after pages
        change (``PageAllocator.plan_current``)."""
        return False

    # ------------------------------------------------------------------------------ the lanes' pages
    def free_pages_per_lane(self) -> np.ndarray:
        """Free pages of each storage lane, int64 ``[lanes]``."""
        return self.lanes.free_pages_per_lane()

    def used_pages_per_lane(self) -> np.ndarray:
        """Pages handed out per storage lane, int64 ``[lanes]``."""
        return self.lanes.used_pages_per_lane()

    @property
    def total_free_pages(self) -> int:
        """Free pages over all storage lanes."""
        return self.lanes.total_free_pages

    def is_free(self, pages) -> np.ndarray:
        """Bool ``[n]``: whether each page is free (the lanes' ``is_free``)."""
        return self.lanes.is_free(pages)

    def alloc_pages(self, owners) -> np.ndarray:
        """One page of each lane listed, atomically (the lanes' ``alloc_pages``)."""
        return self.lanes.alloc_pages(owners)

    def free(self, pages) -> None:
        """Return pages to the lanes (their ``free``: all or nothing)."""
        self.lanes.free(pages)

    def release_tail(self, page_ids, new_len: int) -> np.ndarray:
        """The lanes' ``release_tail`` (C-DRAFT) in the design's pages."""
        return self.lanes.release_tail(page_ids, new_len)

    # ----------------------------------------------------------------------------------- allocation
    def plan_extend(self, prefix_lens, extend_lens, last_locs) -> BatchPlan:
        """The compute plan of the batch with the design's new pages (nothing taken)."""
        raise NotImplementedError

    def allocate(self, plan: BatchPlan, last_locs) -> ExtendAllocation:
        """Take the new pages of ``plan`` (a ``plan_extend`` result with the lanes unchanged since) and give
        every extend token its slot; ``ExtendAllocation`` whose ``plan`` is ``plan``. LaneExhausted when a
        lane is short; nothing is taken then."""
        raise NotImplementedError

    def alloc_extend(self, prefix_lens, extend_lens, last_locs) -> ExtendAllocation:
        """``allocate(plan_extend(...), last_locs)``: plan and allocate a batch at once (as the owner-lane
        allocator's ``alloc_extend``)."""
        return self.allocate(self.plan_extend(prefix_lens, extend_lens, last_locs), last_locs)

    def alloc_draft(self, seq_lens, last_locs, num_draft_tokens: int) -> ExtendAllocation:
        """``alloc_extend(seq_lens, [k] * B, last_locs)`` (C-DRAFT's rule in this design's pages; the lengths
        checked as ``OwnerLaneAllocator.alloc_draft`` checks them, ``allocator.checks.draft_lengths``)."""
        return self.alloc_extend(*draft_lengths(seq_lens, num_draft_tokens), last_locs)
