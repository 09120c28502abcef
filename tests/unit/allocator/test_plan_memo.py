"""Kept plans (``cpkv/allocator/memo.py``) equal a fresh plan of the same state, bit for bit (C-BALANCED, C-ALLOC).

``plan_extend`` keeps its plan for the ``alloc_extend`` that follows; under ``balanced`` a kept plan made
with other free pages is reused when the new free pages choose the same phases. Differential check: after
any change of free pages, the second ``plan_extend`` equals the plan of a copy of the allocator that keeps
no plan.
"""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig, OwnerLaneAllocator
from cpkv.allocator.memo import PlanMemo

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-BALANCED")]

FIELDS = ("request_phases", "head_owners", "page_owners", "page_indptr", "token_owner", "gather_index",
          "per_rank_tokens", "last_token_owner")  # fmt: skip


def fresh_plan(alloc: OwnerLaneAllocator, *args):
    clone = copy.deepcopy(alloc)
    clone._memo = PlanMemo()
    return clone.plan_extend(*args)


def assert_same_plan(a, b):
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in ("req", "owner", "length", "pages"):
        np.testing.assert_array_equal(getattr(a.token_runs, name), getattr(b.token_runs, name), err_msg=name)


@settings(max_examples=120, deadline=None)
@given(C=st.integers(2, 6), P=st.sampled_from([1, 4, 16]), policy=st.sampled_from(["balanced", "rotation"]),
       data=st.data())  # fmt: skip
def test_a_plan_after_free_pages_changed_equals_a_fresh_plan(C, P, policy, data):
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy), data.draw(st.lists(st.integers(3, 10), min_size=C, max_size=C)))
    held = [int(p) for r in data.draw(st.lists(st.integers(0, C - 1), max_size=6), label="warm")
            if alloc.free_pages_per_lane()[r] > 1 for p in alloc.alloc_pages([r])]  # fmt: skip
    B = data.draw(st.integers(1, 4), label="B")
    args = ([0] * B, [data.draw(st.integers(1, 3 * C * P), label="E") for _ in range(B)], [-1] * B)
    first = alloc.plan_extend(*args)
    assert_same_plan(first, fresh_plan(alloc, *args))
    for _ in range(data.draw(st.integers(1, 3), label="changes")):  # take or give back pages, as eviction does
        if held and data.draw(st.booleans(), label="free"):
            alloc.free([held.pop(data.draw(st.integers(0, len(held) - 1), label="which"))])
        else:
            lanes = np.flatnonzero(alloc.free_pages_per_lane() > 0)
            if lanes.size:
                held += alloc.alloc_pages([int(lanes[data.draw(st.integers(0, lanes.size - 1), label="lane")])]).tolist()
        assert_same_plan(alloc.plan_extend(*args), fresh_plan(alloc, *args))


def test_a_kept_balanced_plan_is_reused_when_the_phases_stay():
    # C=2, P=1, one 3-token request (pages 2 + 1 or 1 + 2 by phase). Free [9, 8]: phase 1 (lane 0 takes
    # two). Free [9, 9]: phase 0 (the tie goes to the rotation phase): a new plan. Free [9, 10]: phase 0
    # again, so the plan kept at [9, 9] comes back as it is.
    alloc = OwnerLaneAllocator(CPConfig(2, 1, "balanced"), 10)
    held = alloc.alloc_pages([1, 1])
    first = alloc.plan_extend([0], [3], [-1])
    assert first.request_phases.tolist() == [1]
    alloc.free(held[:1])
    second = alloc.plan_extend([0], [3], [-1])
    assert second.request_phases.tolist() == [0] and second is not first
    assert_same_plan(second, fresh_plan(alloc, [0], [3], [-1]))
    alloc.free(held[1:])
    assert alloc.free_pages_per_lane().tolist() == [9, 10]
    assert alloc.plan_extend([0], [3], [-1]) is second
