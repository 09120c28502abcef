"""cpkv: context-parallel prefill with an owner-lane sharded, paged KV cache.

Public API (SPEC section 10): ``CPConfig``, ``owner_lane_phase``, ``plan_request``, ``plan_batch``,
``mqa_logits_elements``, ``SharedKVLayout`` (sharded or replicated pools), ``OwnerLaneAllocator``,
``rank_kv_lens`` / ``verify_rank_kv_lens`` (speculative decoding) and the error types.
"""

from .allocator import ExtendAllocation, OwnerLaneAllocator
from .cache import CacheEntry, HostTier, InsertResult, PrefixCache, PrefixMatch
from .config import OWNER_POLICIES, CPConfig
from .errors import (
    AllocatorError,
    ConfigError,
    CpkvError,
    LaneExhausted,
    LayoutError,
    PlanError,
    PoolKindError,
    PrefixCacheError,
    UnsupportedPagePlan,
)
from .estimator import mqa_logits_elements
from .kv_lens import rank_kv_lens, verify_rank_kv_lens
from .layout import POOL_KINDS, SharedKVLayout
from .planner import BatchPlan, RequestPlan, owner_lane_phase, plan_batch, plan_request

__all__ = [
    "CacheEntry",
    "HostTier",
    "InsertResult",
    "PrefixCache",
    "PrefixCacheError",
    "PrefixMatch",
    "OWNER_POLICIES",
    "POOL_KINDS",
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
    "PoolKindError",
    "RequestPlan",
    "SharedKVLayout",
    "UnsupportedPagePlan",
    "mqa_logits_elements",
    "owner_lane_phase",
    "plan_batch",
    "plan_request",
    "rank_kv_lens",
    "verify_rank_kv_lens",
]

__version__ = "0.1.0"
