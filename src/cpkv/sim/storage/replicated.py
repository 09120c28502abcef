"""``replicated``: every rank stores every page (SGLang's in-sequence-split CP up to 0.5.9; SPEC C-STORAGE,
C-POOL's replicated kind).

With ``Q`` pages of HBM per rank the group holds ``Q`` pages (the smallest rank's ``Q`` when ranks differ:
every rank holds all of them), C times fewer than owner lanes. Each layer all-gathers the extend's latent
and index-key rows so every rank writes all of them; nothing else moves (the prefix is on every rank).
The prefix cache's unit is one page. Compute is the group's CP split (``cp_strategy``) over the C ranks.
"""

from __future__ import annotations

import numpy as np

from ...allocator import ExtendAllocation, OwnerLaneAllocator
from ...cache import PrefixCache
from ...config import CPConfig
from ..config import SimConfig
from .base import KVStorage
from .compute import CPCompute
from .one_pool import OnePoolAllocator


class ReplicatedStorage(KVStorage):
    """The replicated design: ``OwnerLaneAllocator(..., kind="replicated")`` of ``min(Q_r)`` pages.

    The owner policy has nothing to place (one lane: every policy places alike, C-POOL); admission keeps no
    per-lane reservation (one lane: the total is the lane).
    """

    name = "replicated"
    alloc: OnePoolAllocator
    per_lane_reservation = False

    def __init__(self, config: SimConfig, policy: str, cost) -> None:
        super().__init__(config, cost)
        C, P = config.cp_size, config.page_size
        self.lanes = OwnerLaneAllocator(
            CPConfig(C, P, policy, config.cp_strategy), min(config.lane_capacities), kind="replicated"
        )
        self.alloc = OnePoolAllocator(self.lanes, CPCompute(C, P, config.cp_strategy))
        self.cache = PrefixCache(self.lanes, host_pages_per_lane=config.host_pages_per_lane)
        self.page_size = P

    def used_pages_per_rank(self) -> np.ndarray:
        return np.full(
            self.cp_size, int(self.lanes.used_pages_per_lane()[0]), dtype=np.int64
        )  # on every rank

    def step_traffic(self, rows, allocation: ExtendAllocation) -> float:
        return self.traffic.add_allgathers(allocation.plan.max_rank_tokens)

    def scratch_allocator(self) -> OnePoolAllocator:
        lanes = OwnerLaneAllocator(self.lanes.config, int(self.lanes.lane_pages[0]), kind="replicated")
        return OnePoolAllocator(lanes, self.alloc.compute)
