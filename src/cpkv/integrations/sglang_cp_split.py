"""SGLang's CP prefill split from cpkv's plan: each rank computes the tokens of its own pages (C-OWNER-EQ-COMPUTE).

``prepare_cp_metadata`` is an AROUND hook (registered by ``sglang_hooks``) on SGLang 0.5.23's
``sglang.srt.layers.cp.utils.prepare_cp_forward``: under ``SGLANG_PLATFORM=cpkv`` it first sets
``forward_batch.attn_cp_metadata`` to ``sglang_cp.zigzag_metadata(allocator.last_plan, attn_cp_rank)``,
padded by SGLang's own step; SGLang then keeps it and does the rest. ``page_aligned_chunk`` (AROUND
``PrefillAdder.floor_chunked_tokens``) rounds continuing-chunk cuts down to whole pages. The allocator is
found through the forward's KV pool (``pool.owner_lane_allocator``), and ``last_plan`` is checked to be
this forward's batch (lengths, and every ``out_cache_loc`` on its planned lane).

Raises (one line, never a silent fall-back to SGLang's split): ``UnsupportedPagePlan`` for head tokens
(C-HEAD; naming rid, prefix_len and page_size) or an ``interleave`` plan (C-INTERLEAVE); ``ConfigError``
for a plan that is not this batch's, a pool without cpkv's allocator, or SGLang's ``interleave`` strategy.
Passes through when cpkv is not selected or the metadata is already set. Walk-through: docs/sglang.md,
"Launch: two plugins". Imports no sglang at import time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ConfigError, UnsupportedPagePlan
from .sglang_checks import selected

TARGET = "sglang.srt.layers.cp.utils.prepare_cp_forward"
"""The SGLang function ``prepare_cp_metadata`` wraps (AROUND)."""

CHUNK_TARGET = "sglang.srt.managers.schedule_policy.PrefillAdder.floor_chunked_tokens"
"""The SGLang method ``page_aligned_chunk`` wraps (AROUND): chunk cuts on page ends."""

POOL_ATTRIBUTE = "owner_lane_allocator"
"""The attribute cpkv's allocator sets on the KV pool it is built with (its way back to the plan)."""


def batch_allocator():
    """The cpkv allocator of this forward's KV pool, or None when SGLang publishes no forward context or its
    pool is not linked to one (``pool.owner_lane_allocator``)."""
    from sglang.srt.model_executor.forward_context import get_token_to_kv_pool, has_forward_context

    from .sglang import OwnerLaneTokenToKVPoolAllocator

    if not has_forward_context():
        return None
    allocator = getattr(get_token_to_kv_pool(), POOL_ATTRIBUTE, None)
    return allocator if isinstance(allocator, OwnerLaneTokenToKVPoolAllocator) else None


def _rid(forward_batch, i: int) -> str:
    rids = getattr(forward_batch, "rids", None)
    return repr(rids[i]) if rids is not None and i < len(rids) else f"#{i}"


def _ints(values) -> np.ndarray:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return np.asarray(list(values), dtype=np.int64).reshape(-1)


def check_plan_is_batch(plan, forward_batch) -> None:
    """ConfigError (one line) unless ``plan`` is this forward's batch: its ``extend_lens`` are the batch's
    ``extend_seq_lens_cpu``, its ``prefix_lens`` are ``seq_lens_cpu - extend``, and every extend token's
    ``out_cache_loc`` (int64 ``[sum E]``, group slots) is on a page of the lane ``token_owner`` gives it."""
    if plan is None:
        raise ConfigError("cpkv CP prefill: the allocator has no plan (no allocation yet) for this forward")
    extend = _ints(forward_batch.extend_seq_lens_cpu)
    prefix = _ints(forward_batch.seq_lens_cpu) - extend
    if not (np.array_equal(extend, plan.extend_lens) and np.array_equal(prefix, plan.prefix_lens)):
        raise ConfigError(
            f"cpkv CP prefill: the allocator's last plan (prefix_lens {plan.prefix_lens.tolist()}, "
            f"extend_lens {plan.extend_lens.tolist()}) is not this forward's batch (prefix_lens "
            f"{prefix.tolist()}, extend_lens {extend.tolist()})"
        )
    C, P, N = plan.config.cp_size, plan.config.page_size, int(extend.sum())
    loc = _ints(forward_batch.out_cache_loc[:N].cpu())
    if loc.shape[0] != N:
        raise ConfigError(f"cpkv CP prefill: out_cache_loc holds {loc.shape[0]} slots for {N} extend tokens")
    lanes = loc // P % C
    off = np.flatnonzero(lanes != plan.token_owner)
    if off.size:
        t = int(off[0])
        raise ConfigError(
            f"cpkv CP prefill: out_cache_loc does not match the allocator's last plan (token {t} of "
            f"{N}: slot on lane {lanes[t]}, plan's owner {plan.token_owner[t]})"
        )


def cp_metadata(forward_batch, allocator, rank: int):
    """SGLang's ``ZigzagContextParallelMetadata`` of ``rank`` from ``allocator.last_plan`` (cpkv's
    ``sglang_cp.zigzag_metadata``, every SGLang field, plus ``request_phases``), not yet padded.

    Raises: ConfigError (``check_plan_is_batch``); UnsupportedPagePlan naming the request's rid.
    """
    from sglang.srt.layers.cp.zigzag import ZigzagContextParallelMetadata

    from .sglang_cp import zigzag_metadata

    plan = allocator.last_plan
    check_plan_is_batch(plan, forward_batch)
    device = getattr(getattr(forward_batch, "out_cache_loc", None), "device", "cpu")
    try:
        ours = zigzag_metadata(plan, rank, device=device)
    except UnsupportedPagePlan as e:
        head = np.flatnonzero(plan.head_tokens > 0)
        who = f"request {_rid(forward_batch, int(head[0]))}" if head.size else "a request"
        raise UnsupportedPagePlan(f"cpkv CP prefill, {who}: {e}") from None
    meta = ZigzagContextParallelMetadata(
        **{f.name: getattr(ours, f.name) for f in dataclasses.fields(ZigzagContextParallelMetadata)}
    )
    meta.request_phases = ours.request_phases
    return meta


def prepare_cp_metadata(original, forward_batch, *args, **kwargs):
    """AROUND ``prepare_cp_forward``: under cpkv, ``forward_batch.attn_cp_metadata`` = cpkv's split for
    SGLang's attention-CP rank (``cp_metadata``), padded by SGLang's ``pad_logical_token_to_physical``; then
    SGLang's function, which keeps it (module docstring).

    Raises:
        UnsupportedPagePlan: a request with head tokens (its prefix ends inside a page), naming its rid.
        ConfigError: SGLang's interleave strategy, a KV pool with no cpkv allocator, or a plan that is not
            this forward's batch; one line each.
    """
    if not selected() or getattr(forward_batch, "attn_cp_metadata", None) is not None:
        return original(forward_batch, *args, **kwargs)
    from sglang.srt.layers.cp.base import get_cp_strategy
    from sglang.srt.layers.cp.padding import pad_logical_token_to_physical
    from sglang.srt.layers.cp.zigzag import ZigzagCPStrategy
    from sglang.srt.runtime_context import get_parallel

    strategy = get_cp_strategy()
    if not isinstance(strategy, ZigzagCPStrategy):
        raise ConfigError(
            f"cpkv CP prefill: SGLang's cp_strategy is {getattr(strategy, 'name', strategy)!r}; "
            "cpkv's plans are zigzag (--cp-strategy zigzag)"
        )
    allocator = batch_allocator()
    if allocator is None:
        raise ConfigError(
            "cpkv CP prefill: this forward's KV pool has no cpkv allocator (owner_lane_allocator), "
            "so its split cannot follow cpkv's owners"
        )
    forward_batch.attn_cp_metadata = cp_metadata(forward_batch, allocator, int(get_parallel().attn_cp_rank))
    pad_logical_token_to_physical(forward_batch.attn_cp_metadata)
    return original(forward_batch, *args, **kwargs)


def page_aligned_chunk(original, self, trunc_len: int, remaining: int) -> int:
    """AROUND ``PrefillAdder.floor_chunked_tokens`` (the length of a chunk SGLang cuts from a request's
    remaining ``remaining`` tokens: a continuing chunk, ``add_chunked_req``, and the ignore-eos path): under
    cpkv at C > 1 a cut (``< remaining``) is rounded down to whole pages, so the next chunk's prefix ends on
    a page and has no head tokens; a cut under one page is left as SGLang makes it (no progress would be
    worse; that chunk's successor then stops in ``prepare_cp_metadata``). SGLang's first-chunk admission
    already cuts at a page end; its own sharding aligns continuing chunks the same way (``kv_shard_granule``)."""
    out = original(self, trunc_len, remaining)
    allocator = getattr(self, "token_to_kv_pool_allocator", None)
    if not selected() or getattr(allocator, "cp_size", 1) <= 1 or out >= remaining:
        return out
    from .sglang import OwnerLaneTokenToKVPoolAllocator

    if not isinstance(allocator, OwnerLaneTokenToKVPoolAllocator):
        return out
    P = allocator.page_size
    return out // P * P or out


def hooks() -> list[tuple[str, object, str]]:
    """``(target, hook, kind)`` of this module, in ``sglang_hooks.hooks``' format."""
    return [(TARGET, prepare_cp_metadata, "AROUND"), (CHUNK_TARGET, page_aligned_chunk, "AROUND")]


__all__ = [
    "CHUNK_TARGET",
    "POOL_ATTRIBUTE",
    "TARGET",
    "batch_allocator",
    "check_plan_is_batch",
    "cp_metadata",
    "hooks",
    "page_aligned_chunk",
    "prepare_cp_metadata",
]
