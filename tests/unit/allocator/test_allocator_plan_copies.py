"""A plan commits at most once, and only the plan object ``plan_extend`` returned commits (SPEC C-ALLOC,
C-ATOMIC).

The allocator records each plan it made in a weak table keyed by the plan object (``stamp.Commits``), so the
``BatchPlan`` type carries no allocator state: a copy (``copy.copy``, ``dataclasses.replace``, ``deepcopy``,
a pickled plan) is another object and is refused, before or after the plan itself commits. A property test
runs random plan / copy / commit / free sequences against an independent checker of the slots live requests
hold (tests/held_slots.py): no slot is handed out twice.
"""

import copy
import dataclasses
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator_state import snapshot
from cpkv import CPConfig, OwnerLaneAllocator, plan_batch
from cpkv.errors import AllocatorError, LaneExhausted, StalePlanError
from cpkv.plan import BatchPlan
from held_slots import HeldSlots

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ALLOC", "C-ATOMIC")]

COPIES = {
    "copy.copy": copy.copy,
    "dataclasses.replace": dataclasses.replace,
    "copy.deepcopy": copy.deepcopy,
    "pickle": lambda p: pickle.loads(pickle.dumps(p)),
}


def _head_plan():
    """The issue's reproduction: C=4, P=4, 6 tokens held (slots .. 5), a plan of 5 more with head slots 6, 7."""
    a = OwnerLaneAllocator(CPConfig(4, 4, "rotation"), 16)
    first = a.alloc_extend([0], [6], [-1])
    last = int(first.out_cache_loc_cpu[-1])
    return a, last, a.plan_extend([6], [5], [last])


@pytest.mark.parametrize("how", sorted(COPIES))
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_copied_plan_is_refused_and_the_plan_commits_once(how, when):
    a, last, p = _head_plan()
    q = COPIES[how](p)
    assert q is not p and q.page_owners.tolist() == p.page_owners.tolist()
    if when == "after":
        assert a.allocate(p, [last]).out_cache_loc_cpu.tolist()[:2] == [6, 7]
    state = snapshot(a)
    with pytest.raises(StalePlanError, match=r"that object itself \(a copy of it is refused\)"):
        a.allocate(q, [last])
    assert snapshot(a) == state
    if when == "before":  # the plan itself still commits, once
        assert a.allocate(p, [last]).out_cache_loc_cpu.tolist()[:2] == [6, 7]
    with pytest.raises(StalePlanError, match=r"allocated already \(a plan commits once\)"):
        a.allocate(p, [last])


def test_the_commit_tables_hold_no_plan_alive():
    a = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 8)
    for _ in range(50):
        a.plan_extend([0], [9], [-1])  # made and dropped
    kept = a.plan_extend([0], [9], [-1])
    assert len(a._commits._stamps) == len(a._commits._open) == 1
    a.allocate(kept, [-1])
    assert len(a._commits._stamps) == 1 and len(a._commits._open) == 0  # committed: known, closed
    del kept
    assert len(a._commits._stamps) == 0


def test_a_plan_carries_no_allocator_state():
    # the stamp lives in the allocator (stamp.Commits), not on the plan: plan_extend's plan has exactly the
    # fields of plan_batch's, equal values, and another allocator refuses it
    a = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 8)
    p = a.plan_extend([0], [9], [-1])
    q = plan_batch([0], [9], a.config)
    names = [f.name for f in dataclasses.fields(BatchPlan)]
    assert "stamp" not in names
    assert all(
        np.array_equal(getattr(p, n), getattr(q, n)) for n in names if n not in ("config", "token_runs")
    )
    with pytest.raises(StalePlanError, match="this allocator's plan_extend made"):
        OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 8).allocate(p, [-1])
    with pytest.raises(StalePlanError, match="this allocator's plan_extend made"):
        a.allocate(q, [-1])  # plan_batch's plan: no allocator made it
    assert a.allocate(p, [-1]).new_pages.tolist() == [2, 1, 3]  # zigzag segments 0, 1, 2 on lanes 0, 1, 1


@settings(max_examples=300, deadline=None)
@given(
    C=st.integers(1, 4),
    P=st.sampled_from([1, 2, 4]),
    policy=st.sampled_from(["rotation", "legacy", "balanced"]),
    data=st.data(),
)
def test_random_plan_copy_commit_free_never_hands_out_a_slot_twice(C, P, policy, data):
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy), data.draw(st.integers(2, 6), label="Q"))
    held = HeldSlots(P)
    pending = []  # (plan, rid, prefix_len, last_loc, family, how)
    spent: set[int] = set()  # families (an original plan and its copies) that committed
    families, next_rid = 0, 0
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        op = data.draw(st.sampled_from(["plan_new", "plan_extend", "copy", "commit", "free"]), label="op")
        if op == "plan_new" or (op == "plan_extend" and held.requests):
            if op == "plan_new":
                rid, L0, last = next_rid, 0, -1
                next_rid += 1
            else:  # one plan per request and state: a second plan of the same head is the caller's bug
                rid = data.draw(st.sampled_from(sorted(held.requests)), label="rid")
                if any(e[1] == rid for e in pending):
                    continue
                L0, last = len(held.requests[rid]), held.last_loc(rid)
            E = data.draw(st.integers(1, 3 * P), label="E")
            try:
                plan = alloc.plan_extend([L0], [E], [last])
            except LaneExhausted:
                continue
            pending.append((plan, rid, L0, last, families, "plan"))
            families += 1
        elif op == "copy" and pending:
            plan, rid, L0, last, fam, was = data.draw(st.sampled_from(pending), label="of")
            how = data.draw(st.sampled_from(sorted(COPIES)), label="how")
            pending.append((COPIES[how](plan), rid, L0, last, fam, how))  # a copy (of a copy) never commits
        elif op == "commit" and pending:
            i = data.draw(st.integers(0, len(pending) - 1), label="which")
            plan, rid, L0, last, fam, how = pending.pop(i)
            state = snapshot(alloc)
            try:
                got = alloc.allocate(plan, [last])
            except (StalePlanError, LaneExhausted, AllocatorError) as e:
                assert snapshot(alloc) == state, "a refused commit changed the pool"
                if isinstance(e, StalePlanError):
                    assert fam in spent or how != "plan" or policy == "balanced", (
                        f"{how} of family {fam} refused: {e}"
                    )
                continue
            held.take(rid, got.out_cache_loc_cpu.tolist())  # no slot held already (the independent check)
            assert fam not in spent, f"family {fam} committed twice ({how})"
            assert how == "plan", f"a {how} plan committed"
            spent.add(fam)
        elif op == "free" and held.requests:
            rid = data.draw(st.sampled_from(sorted(held.requests)), label="free")
            alloc.free(held.release(rid))
            pending = [e for e in pending if e[1] != rid or e[2] == 0]  # a freed request's plans are void
        for rid in held.requests:
            assert not alloc.is_free(held.pages(rid)).any()
        assert int(alloc.used_pages_per_lane().sum()) == held.num_pages()
    for rid in sorted(held.requests):
        alloc.free(held.release(rid))
    assert alloc.free_pages_per_lane().tolist() == alloc.capacity_per_lane.tolist()
    assert np.all(alloc.used_pages_per_lane() == 0)
