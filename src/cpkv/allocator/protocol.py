"""``PageAllocator``: the calls the simulator's scheduler makes of a group's allocator, whatever the KV storage
design (SPEC C-ALLOC, C-DRAFT, C-STORAGE).

``OwnerLaneAllocator`` implements it, and so does ``sim.storage.allocator.StorageAllocator`` (the designs whose
pages are not placed by the ranks that compute them). The scheduler (``sim.admission.StepBuilder``,
``sim.spec_decode.SpecDecoder``, ``sim.reservation``, ``sim.engine.PolicyRun`` and the ``cache.flow.RequestFlow``
it drives) uses these members and no others; tests/unit/allocator/test_page_allocator_protocol.py checks both.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..plan import BatchPlan
from .result import ExtendAllocation


@runtime_checkable
class PageAllocator(Protocol):
    """A paged KV pool of ``len(capacity_per_lane)`` lanes that plans, then commits, a batch's new pages.

    Page counts are in the allocator's pages of ``page_size`` tokens; per-lane arrays are int64 ``[lanes]``.

    Attributes:
        capacity_per_lane: usable pages of each lane (page 0 excluded), int64 ``[lanes]``.
        num_pages: page ids run over ``0 .. num_pages - 1``.
    """

    capacity_per_lane: np.ndarray
    num_pages: int

    @property
    def page_size(self) -> int:
        """Tokens per page (P, or a virtual block's ``P * C``)."""
        ...

    @property
    def total_free_pages(self) -> int:
        """Free pages over all lanes."""
        ...

    @property
    def replans_after_eviction(self) -> bool:
        """Whether a plan may change when pages are freed (its placement reads the free pages), so the
        scheduler plans a batch again after each eviction (``sim.admission.StepBuilder.commit``)."""
        ...

    def free_pages_per_lane(self) -> np.ndarray:
        """Free pages of each lane, int64 ``[lanes]`` (a copy)."""
        ...

    def used_pages_per_lane(self) -> np.ndarray:
        """Pages handed out and not yet freed, per lane, int64 ``[lanes]``."""
        ...

    def plan_extend(self, prefix_lens: object, extend_lens: object, last_locs: object) -> BatchPlan:
        """The plan ``alloc_extend`` would allocate now (``[B]`` ints each), taking no page."""
        ...

    def plan_current(self, plan: BatchPlan, last_locs: np.ndarray) -> bool:
        """Whether ``allocate(plan, last_locs)`` would commit ``plan`` now (the plan ``plan_extend`` would
        make now is that plan); ``last_locs`` int64 ``[B]``. False is always safe (plan again)."""
        ...

    def allocate(self, plan: BatchPlan, last_locs: object) -> ExtendAllocation:
        """Take the new pages of ``plan`` (this allocator's ``plan_extend`` result), atomically."""
        ...

    def alloc_extend(self, prefix_lens: object, extend_lens: object, last_locs: object) -> ExtendAllocation:
        """``allocate(plan_extend(...), last_locs)`` in one call."""
        ...

    def alloc_draft(self, seq_lens: object, last_locs: object, num_draft_tokens: int) -> ExtendAllocation:
        """``alloc_extend(seq_lens, [k] * B, last_locs)`` (C-DRAFT)."""
        ...

    def alloc_pages(self, owners: object) -> np.ndarray:
        """One page of each lane in ``owners`` (``[n]``), atomically; int64 ``[n]`` page ids."""
        ...

    def free(self, pages: object) -> None:
        """Return pages (``[n]`` ids) to their lanes; all or nothing."""
        ...

    def release_tail(self, page_ids: object, new_len: int) -> np.ndarray:
        """Free a request's pages that hold no position below ``new_len`` (C-DRAFT); the ids freed."""
        ...
