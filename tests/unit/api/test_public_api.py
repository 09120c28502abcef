"""SPEC section 10: the stable public names import from ``cpkv`` with the documented signatures."""

import inspect

import numpy as np
import pytest
import torch

import cpkv

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-API")]

NAMES = [
    "CPConfig",
    "owner_lane_phase",
    "plan_request",
    "plan_batch",
    "mqa_logits_elements",
    "SharedKVLayout",
    "OwnerLaneAllocator",
    "CpkvError",
    "PlanError",
    "UnsupportedPagePlan",
    "LaneExhausted",
    "rank_kv_lens",
    "verify_rank_kv_lens",
    "POOL_KINDS",
    "PoolKindError",
]


def _params(fn):
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_names_exported():
    missing = [n for n in NAMES if not hasattr(cpkv, n)]
    assert missing == []
    assert set(NAMES) <= set(cpkv.__all__)


def test_signatures():
    E = inspect.Parameter.empty
    assert _params(cpkv.owner_lane_phase) == [
        ("prefix_len", "POSITIONAL_OR_KEYWORD", E),
        ("page_size", "POSITIONAL_OR_KEYWORD", E),
        ("req_index", "POSITIONAL_OR_KEYWORD", E),
        ("cp_size", "POSITIONAL_OR_KEYWORD", E),
    ]
    assert _params(cpkv.plan_request) == [
        ("prefix_len", "POSITIONAL_OR_KEYWORD", E),
        ("extend_len", "POSITIONAL_OR_KEYWORD", E),
        ("config", "POSITIONAL_OR_KEYWORD", E),
        ("req_index", "KEYWORD_ONLY", 0),
        ("head_owner", "KEYWORD_ONLY", None),
        ("phase", "KEYWORD_ONLY", None),
    ]
    assert _params(cpkv.plan_batch) == [
        ("prefix_lens", "POSITIONAL_OR_KEYWORD", E),
        ("extend_lens", "POSITIONAL_OR_KEYWORD", E),
        ("config", "POSITIONAL_OR_KEYWORD", E),
        ("head_owners", "KEYWORD_ONLY", None),
        ("phases", "KEYWORD_ONLY", None),
    ]
    assert [p[0] for p in _params(cpkv.CPConfig)] == [
        "cp_size",
        "page_size",
        "owner_policy",
        "cp_strategy",
    ]  # C-INTERLEAVE
    assert _params(cpkv.OwnerLaneAllocator) == [
        ("config", "POSITIONAL_OR_KEYWORD", E),
        ("pages_per_lane", "POSITIONAL_OR_KEYWORD", E),
        ("device", "POSITIONAL_OR_KEYWORD", "cpu"),
        ("kind", "KEYWORD_ONLY", "sharded"),
    ]
    assert _params(cpkv.SharedKVLayout) == [
        ("cp_size", "POSITIONAL_OR_KEYWORD", E),
        ("page_size", "POSITIONAL_OR_KEYWORD", E),
        ("pages_per_lane", "POSITIONAL_OR_KEYWORD", E),
        ("kind", "POSITIONAL_OR_KEYWORD", "sharded"),
    ]
    for method in (
        "free_pages_per_lane",
        "alloc_pages",
        "alloc_extend",
        "alloc_decode",
        "alloc_draft",
        "release_tail",
        "free",
    ):
        assert callable(getattr(cpkv.OwnerLaneAllocator, method))
    # SPEC C-DRAFT signatures (section 10).
    assert [p[0] for p in _params(cpkv.OwnerLaneAllocator.alloc_draft)] == [
        "self",
        "seq_lens",
        "last_locs",
        "num_draft_tokens",
    ]
    assert [p[0] for p in _params(cpkv.OwnerLaneAllocator.release_tail)] == ["self", "page_ids", "new_len"]
    assert [p[0] for p in _params(cpkv.rank_kv_lens)] == ["page_ids", "seq_len", "config"]
    assert [p[0] for p in _params(cpkv.verify_rank_kv_lens)] == [
        "page_ids",
        "seq_len",
        "num_draft_tokens",
        "config",
    ]
    for method in ("lane_of", "write_slots", "read_slots", "owned_mask"):
        assert callable(getattr(cpkv.SharedKVLayout, method))


def test_error_hierarchy():
    assert issubclass(cpkv.PlanError, cpkv.CpkvError) and issubclass(cpkv.PlanError, ValueError)
    assert issubclass(cpkv.UnsupportedPagePlan, cpkv.PlanError)
    assert issubclass(cpkv.LaneExhausted, cpkv.CpkvError)
    assert issubclass(cpkv.PoolKindError, cpkv.LayoutError) and issubclass(cpkv.PoolKindError, ValueError)
    e = cpkv.LaneExhausted(2, 5, 1)
    assert (e.lane, e.needed, e.available) == (2, 5, 1) and "lane 2" in str(e)


def test_result_fields_and_dtypes():
    cfg = cpkv.CPConfig(4, 64, "rotation")
    r = cpkv.plan_request(100, 200, cfg, head_owner=1)
    for name in (
        "prefix_len",
        "extend_len",
        "req_index",
        "phase",
        "head_owner",
        "head_tokens",
        "page_owners",
        "token_owner",
        "per_rank_tokens",
        "last_token_owner",
    ):
        assert hasattr(r, name), name
    b = cpkv.plan_batch([0, 100], [10, 200], cfg, head_owners=[None, 1])
    for name in (
        "requests",
        "page_owners",
        "token_owner",
        "per_rank_tokens",
        "request_phases",
        "last_token_owner",
        "max_rank_tokens",
        "gather_index",
    ):
        assert hasattr(b, name), name
    assert b.request_phases.dtype == np.int64 and b.gather_index.shape == (210,)
    assert cpkv.mqa_logits_elements(b).dtype == np.int64
    a = cpkv.OwnerLaneAllocator(cfg, 8).alloc_extend([0], [100], [-1])
    assert a.out_cache_loc.dtype == torch.int64 and a.new_pages.dtype == np.int64 and a.plan.num_tokens == 100
    d = cpkv.OwnerLaneAllocator(cfg, 8).alloc_draft([0, 0], [-1, -1], 3)
    assert isinstance(d, cpkv.ExtendAllocation) and d.out_cache_loc.shape == (6,)
    assert cpkv.rank_kv_lens([4, 1], 100, cfg).dtype == np.int64
    assert cpkv.verify_rank_kv_lens([4, 1], 100, 3, cfg).shape == (3, 4)
    # Inputs may be Python sequences, numpy arrays or CPU tensors (SPEC section 10).
    t = cpkv.plan_batch(torch.tensor([0, 100]), np.array([10, 200]), cfg, head_owners=[None, 1])
    assert t.token_owner.tolist() == b.token_owner.tolist()
