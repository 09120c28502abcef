"""SPEC section 4-6 worked examples, exact values, each naming its clause."""

import numpy as np
import pytest

from cpkv import (
    CPConfig,
    OwnerLaneAllocator,
    PlanError,
    UnsupportedPagePlan,
    owner_lane_phase,
    plan_batch,
    plan_request,
)
from cpkv.policy import zigzag_lane_pages

pytestmark = pytest.mark.unit

C4P64 = CPConfig(4, 64, "rotation")


@pytest.mark.clause("C-ZIGZAG")
@pytest.mark.clause("C-PHASE")
def test_fresh_request_index0():
    # 1000 tokens / 64 = 16 pages -> 8 segments of 2 pages, zigzag ranks 0,1,2,3,3,2,1,0, phase 0.
    p = plan_request(0, 1000, C4P64)
    assert p.phase == 0
    assert p.page_owners.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3, 3, 2, 2, 1, 1, 0, 0]
    # Rank 0 holds pages 0,1,14,15; page 15 has 1000 - 15*64 = 40 tokens -> 64*3 + 40 = 232.
    assert p.per_rank_tokens.tolist() == [232, 256, 256, 256]
    assert p.last_token_owner == 0
    assert p.page_owners.dtype == np.int64 and p.token_owner.dtype == np.int64


@pytest.mark.clause("C-PHASE")
def test_fresh_request_index1_rotates():
    p = plan_request(0, 1000, C4P64, req_index=1)
    assert p.phase == 1
    assert p.page_owners.tolist() == [1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 3, 3, 2, 2, 1, 1]
    assert p.per_rank_tokens.tolist() == [256, 232, 256, 256]


@pytest.mark.clause("C-HEAD")
@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
def test_unaligned_prefix_head_owner():
    # L0=100: phase (100//64 + 0) % 4 = 1; head h = min(200, 64 - 36) = 28 tokens on lane 1.
    # New pages: ceil(100/64)=2 .. ceil(300/64)=5 -> 3 pages, segments [1,1,1,0,...] -> z 0,1,2 -> lanes 1,2,3.
    p = plan_request(100, 200, C4P64, head_owner=1)
    assert (p.phase, p.head_tokens, p.head_owner) == (1, 28, 1)
    assert p.page_owners.tolist() == [1, 2, 3]
    # lane 1: 28 head + 64 (page 2); lane 2: 64 (page 3); lane 3: 300 - 256 = 44 (page 4).
    assert p.per_rank_tokens.tolist() == [0, 92, 64, 44]
    assert p.token_owner[:28].tolist() == [1] * 28
    assert p.last_token_owner == 3


@pytest.mark.clause("C-ZIGZAG")
def test_page_size_one_cp2():
    p = plan_request(0, 5, CPConfig(2, 1))
    assert p.page_owners.tolist() == [0, 0, 1, 1, 0]
    assert p.token_owner.tolist() == [0, 0, 1, 1, 0]
    assert p.per_rank_tokens.tolist() == [3, 2]


@pytest.mark.clause("C-ROTATION-SPREADS")
@pytest.mark.parametrize(("policy", "expected"), [("rotation", [5] * 8), ("legacy", [40] + [0] * 7)])
def test_forty_one_page_chunks(policy, expected):
    cfg = CPConfig(8, 64, policy)
    lanes = np.zeros(8, dtype=np.int64)
    for k in range(40):
        np.add.at(lanes, plan_request(64 * k, 64, cfg).page_owners, 1)
    assert lanes.tolist() == expected


@pytest.mark.clause("C-ROTATION-SPREADS")
@pytest.mark.parametrize(("policy", "expected"), [("rotation", list(range(8))), ("legacy", [0] * 8)])
def test_batch_of_eight_one_page_requests(policy, expected):
    plan = plan_batch([0] * 8, [64] * 8, CPConfig(8, 64, policy))
    assert plan.page_owners.tolist() == expected


@pytest.mark.clause("C-ROTATION-SPREADS")
def test_batch_of_32_ten_token_requests_spreads():
    # Each request needs 1 page in segment 0 -> lane = req_index % 4 -> 8 pages per lane.
    plan = plan_batch([0] * 32, [10] * 32, CPConfig(4, 16, "rotation"))
    assert np.bincount(plan.page_owners, minlength=4).tolist() == [8, 8, 8, 8]


@pytest.mark.clause("C-PHASE")
def test_owner_lane_phase_formula():
    assert owner_lane_phase(0, 64, 0, 4) == 0
    assert owner_lane_phase(100, 64, 0, 4) == 1
    assert owner_lane_phase(64 * 7, 64, 2, 4) == (7 + 2) % 4
    with pytest.raises(PlanError, match="prefix_len=-1"):
        owner_lane_phase(-1, 64, 0, 4)


@pytest.mark.clause("C-PHASE")
def test_legacy_phase_zero_and_explicit_phase_override():
    assert plan_request(640, 64, CPConfig(4, 64, "legacy"), req_index=3).phase == 0
    assert plan_request(640, 64, CPConfig(4, 64, "legacy"), phase=2).page_owners.tolist() == [2]
    # balanced without explicit phases uses the rotation rule (C-BALANCED)
    assert plan_request(640, 64, CPConfig(4, 64, "balanced"), req_index=1).phase == (10 + 1) % 4


@pytest.mark.clause("C-BATCH")
@pytest.mark.clause("C-GATHER")
def test_batch_flattening_and_gather_index():
    # req 0: C=2, P=1, L0=0, E=5 -> owners [0,0,1,1,0]; req 1: E=0 contributes nothing;
    # req 2: L0=0, E=2, phase (0 + 2) % 2 = 0 -> 2 pages: segments [1,1,0,0] -> z 0,1 -> owners [0,1].
    plan = plan_batch([0, 0, 0], [5, 0, 2], CPConfig(2, 1))
    assert plan.token_owner.tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert plan.extend_indptr.tolist() == [0, 5, 5, 7]
    assert plan.request_phases.tolist() == [0, 1, 0]
    assert plan.last_token_owner.tolist() == [0, -1, 1]
    assert plan.per_rank_tokens.tolist() == [4, 3]
    assert plan.max_rank_tokens == 4
    # Rank 0's local rows: tokens 0,1,4,5 -> 0..3; rank 1: tokens 2,3,6 -> 4..6 (offset M=4).
    assert plan.gather_index.tolist() == [0, 1, 4, 5, 2, 3, 6]


@pytest.mark.clause("C-ZIGZAG")
def test_zigzag_lane_pages_matches_plan():
    assert zigzag_lane_pages(16, 1, 4).tolist() == [4, 4, 4, 4]
    assert zigzag_lane_pages(3, 1, 4).tolist() == [0, 1, 1, 1]


@pytest.mark.clause("C-FAIL-FAST")
@pytest.mark.clause("C-HEAD")
def test_errors_name_request_and_value():
    cfg = C4P64
    with pytest.raises(PlanError, match=r"request 1: extend_len=-5 must be >= 0"):
        plan_batch([0, 0], [3, -5], cfg)
    with pytest.raises(PlanError, match=r"request 0: prefix_len=-1"):
        plan_batch([-1], [3], cfg)
    with pytest.raises(PlanError, match=r"extend_lens has 1 entries but prefix_lens has 2"):
        plan_batch([0, 0], [3], cfg)
    with pytest.raises(PlanError, match=r"request 1: head_owner=7 out of range \[0, 4\)"):
        plan_batch([0, 100], [3, 3], cfg, head_owners=[None, 7])
    with pytest.raises(UnsupportedPagePlan, match=r"request 1: prefix_len=100 .* extend_len=5"):
        plan_batch([0, 100], [3, 5], cfg)
    with pytest.raises(PlanError, match=r"request 0: phase=4 out of range"):
        plan_batch([0], [3], cfg, phases=[4])
    with pytest.raises(PlanError, match=r"head_owners has 1 entries"):
        plan_batch([0, 0], [3, 3], cfg, head_owners=[1])
    with pytest.raises(PlanError, match="integers"):
        plan_batch([0.5], [3], cfg)
    # A request whose prefix is unaligned but computes nothing needs no head owner.
    assert plan_request(100, 0, cfg).last_token_owner == -1


@pytest.mark.clause("C-HEAD")
def test_head_owner_recorded_only_with_head_tokens():
    cfg = C4P64
    assert plan_request(0, 10, cfg, head_owner=2).head_owner is None  # aligned prefix: no head page
    assert plan_request(100, 0, cfg, head_owner=2).head_owner is None  # nothing computed
    assert plan_request(100, 5, cfg, head_owner=2).head_owner == 2


@pytest.mark.clause("C-FAIL-FAST")
def test_positions_beyond_2_pow_53_and_outside_int64_are_plan_errors():
    with pytest.raises(PlanError, match=r"exceeds 9007199254740992 \(prefix_len=9223372036854775744"):
        plan_request(2**63 - 64, 128, C4P64)
    with pytest.raises(PlanError, match="prefix_len \\+ extend_len = 9007199254740993 exceeds"):
        plan_request(2**53, 1, C4P64)
    with pytest.raises(PlanError, match="18446744073709551615, outside the int64 range"):
        plan_batch(np.array([2**64 - 1], dtype=np.uint64), [1], C4P64)
    with pytest.raises(PlanError, match="outside the int64 range"):
        plan_batch([10**25], [1], C4P64)


@pytest.mark.clause("C-FAIL-FAST")
def test_object_arrays_of_ints_are_accepted_and_anything_else_is_typed():
    """A numpy object array of Python ints (what ``np.array(list_of_python_ints_and_more)`` can give) plans
    like the ints themselves; one holding a bool, a string or an int beyond int64 is a PlanError naming it
    (it used to escape as a bare StopIteration from every entry point that coerces lengths)."""
    want = plan_batch([0, 128], [7, 300], C4P64)
    got = plan_batch(np.array([0, 128], dtype=object), np.array([7, 300], dtype=object), C4P64)
    assert got.page_owners.tolist() == want.page_owners.tolist()
    assert got.per_rank_tokens.tolist() == want.per_rank_tokens.tolist()
    for bad, what in (
        (True, r"extend_lens\[0\] is True \(bool\), not an integer"),
        ("7", r"extend_lens\[0\] is '7' \(str\), not an integer"),
        (2**70, "extend_lens holds 1180591620717411303424, outside the int64 range"),
    ):
        with pytest.raises(PlanError, match=what):
            plan_batch([0], np.array([bad], dtype=object), C4P64)
    alloc = OwnerLaneAllocator(C4P64, 8)
    res = alloc.alloc_extend([0], np.array([7], dtype=object), [-1])
    assert res.out_cache_loc_cpu.tolist() == list(range(256, 263))
