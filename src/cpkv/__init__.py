"""cpkv: context-parallel prefill with an owner-lane sharded, paged KV cache.

Public API (SPEC section 10): ``CPConfig``, ``owner_lane_phase``, ``plan_request``, ``plan_batch``,
``mqa_logits_elements``, ``SharedKVLayout``, ``OwnerLaneAllocator`` and the error types.
"""

from .allocator import ExtendAllocation, OwnerLaneAllocator
from .config import OWNER_POLICIES, CPConfig
from .errors import (
    AllocatorError,
    ConfigError,
    CpkvError,
    LaneExhausted,
    LayoutError,
    PlanError,
    PrefixCacheError,
    UnsupportedPagePlan,
)
from .estimator import mqa_logits_elements
from .host_tier import HostTier
from .layout import SharedKVLayout
from .planner import BatchPlan, RequestPlan, owner_lane_phase, plan_batch, plan_request
from .prefix_cache import CacheEntry, InsertResult, PrefixCache, PrefixMatch

__all__ = [
    "CacheEntry",
    "HostTier",
    "InsertResult",
    "PrefixCache",
    "PrefixCacheError",
    "PrefixMatch",
    "OWNER_POLICIES",
    "AllocatorError",
    "BatchPlan",
    "CPConfig",
    "ExtendAllocation",
    "OwnerLaneAllocator",
    "ConfigError",
    "CpkvError",
    "LaneExhausted",
    "LayoutError",
    "PlanError",
    "RequestPlan",
    "SharedKVLayout",
    "UnsupportedPagePlan",
    "mqa_logits_elements",
    "owner_lane_phase",
    "plan_batch",
    "plan_request",
]

__version__ = "0.1.0"
