"""Plan, then commit (C-ALLOC, C-ATOMIC, C-BALANCED): ``allocate(plan_extend(...), last_locs)`` is
``alloc_extend``, bit for bit, and a plan the allocator would no longer make is refused before any page is
taken."""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig, OwnerLaneAllocator, plan_batch
from cpkv.errors import AllocatorError, StalePlanError

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ALLOC", "C-ATOMIC", "C-BALANCED")]


@settings(max_examples=150, deadline=None)
@given(
    C=st.integers(1, 6),
    P=st.sampled_from([1, 4, 16]),
    policy=st.sampled_from(["balanced", "rotation", "legacy"]),
    data=st.data(),
)
def test_allocate_of_the_plan_equals_alloc_extend(C, P, policy, data):
    alloc = OwnerLaneAllocator(
        CPConfig(C, P, policy), data.draw(st.lists(st.integers(3, 12), min_size=C, max_size=C))
    )
    for r in data.draw(st.lists(st.integers(0, C - 1), max_size=6), label="warm"):
        if alloc.free_pages_per_lane()[r] > 1:
            alloc.alloc_pages([r])
    B = data.draw(st.integers(1, 4), label="B")
    args = ([0] * B, [data.draw(st.integers(0, 3 * C * P), label="E") for _ in range(B)], [-1] * B)
    twin = copy.deepcopy(alloc)
    plan = alloc.plan_extend(*args)
    assert plan.new_pages_per_lane.tolist() == np.bincount(plan.page_owners, minlength=C).tolist()
    try:
        want = twin.alloc_extend(*args)
    except Exception as e:  # the same refusal, and nothing taken
        with pytest.raises(type(e)):
            alloc.allocate(plan, args[2])
        assert alloc.state_digest() == twin.state_digest()
        return
    got = alloc.allocate(plan, args[2])
    assert got.plan is plan
    assert got.new_pages.tolist() == want.new_pages.tolist()
    assert got.out_cache_loc_cpu.tolist() == want.out_cache_loc_cpu.tolist()
    assert alloc.state_digest() == twin.state_digest()


def test_a_plan_from_elsewhere_or_with_other_last_locs_is_refused():
    cfg = CPConfig(4, 4, "rotation")
    a, b = OwnerLaneAllocator(cfg, 8), OwnerLaneAllocator(cfg, 8)
    before = a.state_digest()
    with pytest.raises(StalePlanError, match="this allocator's plan_extend"):
        a.allocate(b.plan_extend([0], [5], [-1]), [-1])
    with pytest.raises(StalePlanError, match="this allocator's plan_extend"):
        a.allocate(plan_batch([0], [5], cfg), [-1])  # the planner alone: no stamp
    head = a.alloc_extend([0], [6], [-1])  # positions 0-5, last_loc = slot of position 5
    last = int(head.out_cache_loc_cpu[-1])
    plan = a.plan_extend([6], [3], [last])
    with pytest.raises(StalePlanError, match=rf"last_locs \[{last - 1}\] differ from the plan's \[{last}\]"):
        a.allocate(plan, [last - 1])
    assert a.state_digest() != before  # only the first alloc_extend took pages
    digest = a.state_digest()
    with pytest.raises(StalePlanError):
        a.allocate(plan, [last - 1])
    assert a.state_digest() == digest


def test_balanced_plan_is_refused_once_free_pages_choose_other_phases_and_kept_when_they_do_not():
    # C=2, P=1, one 3-token request: zigzag ranks 0 and 1 take 1 and 2 pages, so phase f puts 1 page on
    # lane f and 2 on the other. Free [10, 9] (lane 0 holds page 0, two lane-1 pages taken): phase 0 leaves
    # [9, 7], phase 1 [8, 8] -> phase 1. Taking one more lane-1 page ([10, 8]) keeps phase 1 ([9, 6] vs
    # [8, 7]) and the plan; giving one back ([10, 10]) ties, and the tie goes to the rotation phase 0.
    def fresh():
        alloc = OwnerLaneAllocator(CPConfig(2, 1, "balanced"), 11)
        held = alloc.alloc_pages([1, 1])
        plan = alloc.plan_extend([0], [3], [-1])
        assert alloc.free_pages_per_lane().tolist() == [10, 9] and plan.request_phases.tolist() == [1]
        return alloc, held, plan

    alloc, held, plan = fresh()
    alloc.alloc_pages([1])
    assert alloc.allocate(plan, [-1]).plan is plan
    alloc, held, plan = fresh()
    alloc.free(held[:1])
    digest = alloc.state_digest()
    with pytest.raises(StalePlanError, match=r"choose phases \[0\], not the plan's \[1\]"):
        alloc.allocate(plan, [-1])
    assert alloc.state_digest() == digest


def test_a_plan_commits_once():
    # Two commits of one plan would take its head slots twice (here the slots after last_loc 5, page 1).
    alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 8)
    first = alloc.alloc_extend([0], [6], [-1])
    last = int(first.out_cache_loc_cpu[-1])
    plan = alloc.plan_extend([6], [5], [last])
    alloc.allocate(plan, [last])
    digest = alloc.state_digest()
    with pytest.raises(StalePlanError, match="allocated already"):
        alloc.allocate(plan, [last])
    assert alloc.state_digest() == digest
    twin = copy.deepcopy(alloc)  # a copy commits its own plans only
    with pytest.raises(StalePlanError, match="this allocator's plan_extend"):
        twin.allocate(plan, [last])


def test_rotation_plan_survives_page_changes_but_not_a_freed_last_loc():
    alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 8)
    first = alloc.alloc_extend([0], [6], [-1])  # pages for positions 0-3 and 4-5
    last = int(first.out_cache_loc_cpu[-1])
    plan = alloc.plan_extend([6], [5], [last])
    alloc.alloc_pages([0])  # pages changed: a rotation plan does not depend on them
    assert alloc.allocate(plan, [last]).plan is plan
    second = alloc.alloc_extend([0], [6], [-1])
    last = int(second.out_cache_loc_cpu[-1])
    plan = alloc.plan_extend([6], [1], [last])  # one token into the page holding position 5
    alloc.free(second.new_pages[1:])  # that page is free now
    with pytest.raises(AllocatorError, match="lies on page"):
        alloc.allocate(plan, [last])
