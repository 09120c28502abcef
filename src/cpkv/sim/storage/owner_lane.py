"""``owner-lane``: cpkv's own design (SPEC C-STORAGE, C-ALLOC, C-OWNER-EQ-COMPUTE).

The group holds ``C * Q`` pages; each page lives on the lane of the rank that computes it, which writes
its KV there directly, so prefill moves no KV between ranks; queries read other lanes' rows through the
rank-major view (C-LAYOUT), counted as remote reads (``traffic.owner_lane_reads``). The prefix cache's
unit is one page. The allocator, the cache and the scheduler's rules are exactly the simulator's without
a storage choice: the owner policy places the pages.
"""

from __future__ import annotations

import numpy as np

from ...allocator import ExtendAllocation, OwnerLaneAllocator
from ...cache import PrefixCache
from ...config import CPConfig
from ...policy import follows_free_pages
from ..config import SimConfig
from .base import KVStorage
from .traffic import owner_lane_reads


class OwnerLaneStorage(KVStorage):
    """The owner-lane design under owner policy ``policy`` (``rotation``, ``legacy``, ``balanced``): admission
    keeps per-lane reservations unless the policy follows the free pages (``balanced``)."""

    name = "owner-lane"
    alloc: OwnerLaneAllocator

    def __init__(self, config: SimConfig, policy: str, cost) -> None:
        super().__init__(config, cost)
        self.alloc = OwnerLaneAllocator(
            CPConfig(config.cp_size, config.page_size, policy, config.cp_strategy),
            list(config.lane_capacities),
        )
        self.cache = PrefixCache(self.alloc, host_pages_per_lane=config.host_pages_per_lane)
        self.page_size, self.policy = config.page_size, policy
        self.per_lane_reservation = not follows_free_pages(policy)

    @property
    def label(self) -> str:
        return self.policy

    def used_pages_per_rank(self) -> np.ndarray:
        return self.alloc.used_pages_per_lane()

    def step_traffic(self, rows, allocation: ExtendAllocation) -> float:
        owner_lane_reads(rows, allocation.plan, allocation.out_cache_loc_cpu, self.traffic)
        return 0.0  # reads happen inside the attention kernel: reported, not added (traffic.py)

    def scratch_allocator(self) -> OwnerLaneAllocator:
        return OwnerLaneAllocator(self.alloc.config, list(self.cfg.lane_capacities))
