"""cpkv: context-parallel prefill with an owner-lane sharded, paged KV cache.

Public API (SPEC section 10): ``CPConfig``, ``owner_lane_phase``, ``plan_request``, ``plan_batch``,
``mqa_logits_elements``, ``SharedKVLayout`` (sharded or replicated pools), ``OwnerLaneAllocator``,
``rank_kv_lens`` / ``verify_rank_kv_lens`` (speculative decoding) and the error types.

Names load on first use (PEP 562): ``import cpkv`` imports neither torch nor numpy, so the ``cpkv``
command starts in a fraction of a second and a Ctrl-C during start-up is a clean abort.
"""

from __future__ import annotations

import importlib

_EXPORTS = {  # public name -> the module that defines it
    "ExtendAllocation": ".allocator",
    "OwnerLaneAllocator": ".allocator",
    "CacheEntry": ".cache",
    "HostTier": ".cache",
    "InsertResult": ".cache",
    "PrefixCache": ".cache",
    "PrefixMatch": ".cache",
    "OWNER_POLICIES": ".config",
    "CP_STRATEGIES": ".config",
    "CPConfig": ".config",
    "AllocatorError": ".errors",
    "ConfigError": ".errors",
    "CpkvError": ".errors",
    "LaneExhausted": ".errors",
    "LayoutError": ".errors",
    "PlanError": ".errors",
    "PoolKindError": ".errors",
    "PrefixCacheError": ".errors",
    "UnsupportedPagePlan": ".errors",
    "mqa_logits_elements": ".estimator",
    "rank_kv_lens": ".kv_lens",
    "verify_rank_kv_lens": ".kv_lens",
    "POOL_KINDS": ".layout",
    "SharedKVLayout": ".layout",
    "BatchPlan": ".plan",
    "RequestPlan": ".plan",
    "owner_lane_phase": ".planner",
    "plan_batch": ".planner",
    "plan_request": ".planner",
}

__all__ = [
    "CacheEntry",
    "HostTier",
    "InsertResult",
    "PrefixCache",
    "PrefixCacheError",
    "PrefixMatch",
    "OWNER_POLICIES",
    "CP_STRATEGIES",
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


def __getattr__(name: str):
    """Load a public name from its module on first access (``from cpkv import X`` included)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cpkv' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
