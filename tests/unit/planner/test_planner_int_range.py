"""Planner and allocator scalars beyond int64 or beyond the lanes (C-FAIL-FAST): a typed error naming the
argument and the value, never numpy's bare OverflowError; a bad head owner names what -1 means."""

import pytest

from allocator_state import snapshot
from cpkv import (
    AllocatorError,
    CPConfig,
    OwnerLaneAllocator,
    PlanError,
    owner_lane_phase,
    plan_batch,
    plan_request,
)
from cpkv.validate import MAX_POSITION

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-FAIL-FAST")]


@pytest.mark.parametrize("req_index", [MAX_POSITION + 1, 2**63, 10**30])
def test_req_index_beyond_max_position_is_a_plan_error(req_index):
    cfg = CPConfig(4, 64, "rotation")
    with pytest.raises(PlanError, match=rf"^req_index must be <= {MAX_POSITION}, got {req_index}$"):
        plan_request(0, 4, cfg, req_index=req_index)
    with pytest.raises(PlanError, match=rf"req_index must be <= {MAX_POSITION}, got {req_index}"):
        owner_lane_phase(0, 64, req_index, 4)


def test_req_index_at_max_position_plans_with_the_rotation_phase():
    plan = plan_request(64, 4, CPConfig(4, 64, "rotation"), req_index=MAX_POSITION)
    assert plan.phase == (1 + MAX_POSITION) % 4 == owner_lane_phase(64, 64, MAX_POSITION, 4)


@pytest.mark.parametrize("k", [2**63, 10**30])
def test_alloc_draft_k_beyond_int64_is_an_allocator_error_and_allocates_nothing(k):
    alloc = OwnerLaneAllocator(CPConfig(4, 4, "rotation"), 16)
    alloc.alloc_extend([0], [6], [-1])
    before = snapshot(alloc)
    with pytest.raises(
        AllocatorError, match=rf"^num_draft_tokens must be <= {2**63 - 1} \(the int64 maximum\), got {k}$"
    ):
        alloc.alloc_draft([6], [5], k)
    assert snapshot(alloc) == before


@pytest.mark.parametrize("head", [-2, 4, 10**6])
def test_head_owner_out_of_range_says_minus_one_means_none(head):
    with pytest.raises(
        PlanError,
        match=rf"^request 0: head_owner={head} out of range \[0, 4\), or -1 \(or None\) "
        r"for no head owner$",
    ):
        plan_batch([10], [5], CPConfig(4, 64), head_owners=[head])
    assert plan_batch([10], [5], CPConfig(4, 64), head_owners=[3]).requests[0].head_owner == 3
    assert plan_batch([0], [5], CPConfig(4, 64), head_owners=[-1]).requests[0].head_owner is None


def test_phase_out_of_range_keeps_the_lane_range():
    with pytest.raises(PlanError, match=r"^request 0: phase=-2 out of range \[0, 4\)$"):
        plan_batch([0], [5], CPConfig(4, 64), phases=[-2])
