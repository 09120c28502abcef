"""``interleaved-vblock``: vLLM DCP's virtual blocks (SPEC C-STORAGE).

A virtual block holds ``P * C`` consecutive tokens of a request, ``P`` on each rank (rank ``k`` its
``k``-th page); it is the unit of allocation, matching, insertion and eviction. Block ``v`` is physical
page ``v`` of every rank, so the group's pool is one lane of ``min(Q_r)`` blocks (``OnePoolAllocator``
with pages of ``P * C`` tokens) and the prefix cache over it matches only whole blocks: a prompt hits in
multiples of ``P * C`` tokens (prefix hits vanish at block 128 x DCP 8, vllm-ascend #13750). Capacity is
C times one rank's, as under ``interleaved``, less what partly filled blocks leave empty; traffic is
``interleaved``'s (the extend's rows all-gathered every layer, the prefix gathered).
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
from .traffic import prefix_gather_rows


class VirtualBlockStorage(KVStorage):
    """The interleaved-vblock design: a one-lane pool of ``min(Q_r)`` virtual blocks of ``P * C`` tokens;
    admission keeps no per-lane reservation (one lane: the total is the lane)."""

    name = "interleaved-vblock"
    alloc: OnePoolAllocator
    per_lane_reservation = False

    def __init__(self, config: SimConfig, policy: str, cost) -> None:
        super().__init__(config, cost)
        C, P = config.cp_size, config.page_size
        self.pages_per_unit = C  # pages of P tokens in one block
        self.lanes = OwnerLaneAllocator(
            CPConfig(1, P * C, policy, config.cp_strategy), min(config.lane_capacities)
        )
        self.alloc = OnePoolAllocator(self.lanes, CPCompute(C, P, config.cp_strategy))
        self.cache = PrefixCache(self.lanes, host_pages_per_lane=config.host_pages_per_lane)
        self.page_size = P * C

    def used_pages_per_rank(self) -> np.ndarray:
        return np.full(self.cp_size, int(self.lanes.used_pages_per_lane()[0]), dtype=np.int64)  # a page each

    def step_traffic(self, rows, allocation: ExtendAllocation) -> float:
        C, plan = self.cp_size, allocation.plan
        prefix = prefix_gather_rows(rows, plan, self.page_size, lambda blocks, j: blocks * C + j % C)
        return self.traffic.add_allgathers(plan.max_rank_tokens, prefix)

    def scratch_allocator(self) -> OnePoolAllocator:
        lanes = OwnerLaneAllocator(self.lanes.config, int(self.lanes.lane_pages[0]))
        return OnePoolAllocator(lanes, self.alloc.compute)
