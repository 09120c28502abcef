"""``OnePoolAllocator``: one pool of pages shared by every rank of the group (SPEC C-STORAGE, C-POOL).

Under ``replicated`` every rank stores every page (C-POOL's replicated kind: the pool is the C = 1
allocator of ``Q`` pages of ``P`` tokens). Under ``interleaved-vblock`` the pool's page is a virtual block
of ``P * C`` tokens, one physical page of ``P`` tokens on each rank (vLLM DCP: block ``v`` is physical page
``v`` of every rank, rank ``k`` holding its ``k``-th ``P`` tokens), so a C = 1 allocator of ``Q`` blocks
of ``P * C`` tokens allocates, and the prefix cache over it matches, inserts and evicts, in whole blocks.
Either way the pool has one lane, and the placement of a page is a function of the call alone: the
lowest free page ids first (C-ALLOC).
"""

from __future__ import annotations

import numpy as np

from ...allocator import ExtendAllocation
from ...plan import BatchPlan
from ...runs import indptr
from ...validate import lengths
from .allocator import StorageAllocator
from .compute import new_units, with_storage

_I64 = np.int64


class OnePoolAllocator(StorageAllocator):
    """``StorageAllocator`` over one lane (module docstring); ``page_size`` tokens per page."""

    def plan_extend(self, prefix_lens, extend_lens, last_locs) -> BatchPlan:
        """The compute plan with ``page_owners`` all lane 0 and ``page_indptr`` in the pool's pages.

        Example C=2, P=2, a virtual-block pool (4 tokens a page), one request L0=0, E=6: the compute plan
        has 3 pages of 2 tokens; the storage takes 2 blocks (``page_indptr`` [0, 2]).
        """
        L0, E = lengths(prefix_lens, extend_lens)
        units = new_units(L0, E, self.page_size)
        ptr = indptr(units)
        return with_storage(self.compute.plan(L0, E), np.zeros(int(ptr[-1]), dtype=_I64), ptr)

    def allocate(self, plan: BatchPlan, last_locs) -> ExtendAllocation:
        """The lanes' ``alloc_extend`` of the plan's lengths (the one lane's lowest free pages, atomic)."""
        a = self.lanes.alloc_extend(plan.prefix_lens, plan.extend_lens, last_locs)
        return ExtendAllocation(a.out_cache_loc_cpu, plan, a.new_pages)
