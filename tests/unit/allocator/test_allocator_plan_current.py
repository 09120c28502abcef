"""``plan_current`` (C-ALLOC, C-BALANCED): True exactly when ``allocate`` would commit the plan now, so a
scheduler that freed pages may keep the plan instead of planning again."""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig, OwnerLaneAllocator
from cpkv.errors import AllocatorError, LaneExhausted

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ALLOC", "C-BALANCED")]


@settings(max_examples=200, deadline=None)
@given(
    C=st.integers(1, 5),
    P=st.sampled_from([1, 4]),
    policy=st.sampled_from(["balanced", "rotation", "legacy"]),
    data=st.data(),
)
def test_plan_current_is_true_exactly_when_allocate_commits(C, P, policy, data):
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy), [10] * C)
    head = alloc.alloc_extend([0], [data.draw(st.integers(1, 2 * P), label="head")], [-1])
    last = int(head.out_cache_loc_cpu[-1])
    L0 = head.plan.extend_lens.tolist()
    plan = alloc.plan_extend([L0[0], 0], [data.draw(st.integers(1, 3 * C * P), label="E"), P], [last, -1])
    lasts = [last, -1]
    held = []
    for step in data.draw(st.lists(st.integers(-1, C - 1), max_size=5), label="changes"):
        if step < 0 and held:  # give a page back
            alloc.free([held.pop()])
        elif step >= 0 and alloc.free_pages_per_lane()[step] > 1:
            held += alloc.alloc_pages([step]).tolist()
    if data.draw(st.booleans(), label="free the head"):
        alloc.free(head.new_pages)  # the first request's last_loc now lies on a free page
    current = alloc.plan_current(plan, np.array(lasts, dtype=np.int64))
    twin = copy.deepcopy(alloc)
    try:
        alloc.allocate(plan, lasts)
        committed = True
        assert not alloc.plan_current(plan, np.array(lasts, dtype=np.int64))  # a plan commits once
    except LaneExhausted:  # not a question of the plan: it is current, a lane is short
        committed = True
        assert alloc.state_digest() == twin.state_digest()
    except AllocatorError:
        committed = False
        assert alloc.state_digest() == twin.state_digest()
    assert current == committed


def test_a_copy_a_foreign_plan_or_other_last_locs_is_not_current():
    alloc = OwnerLaneAllocator(CPConfig(2, 1, "balanced"), 8)
    plan = alloc.plan_extend([0], [3], [-1])
    last = np.array([-1], dtype=np.int64)
    assert alloc.plan_current(plan, last)
    assert not alloc.plan_current(copy.copy(plan), last)
    assert not OwnerLaneAllocator(CPConfig(2, 1, "balanced"), 8).plan_current(plan, last)
    assert not alloc.plan_current(plan, np.array([5], dtype=np.int64))
    alloc.allocate(plan, [-1])
    assert not alloc.plan_current(plan, last)
