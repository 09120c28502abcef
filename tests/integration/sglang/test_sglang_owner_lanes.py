"""Owner lanes behind SGLang's allocator calls, cp_size > 1, every owner policy.

Every slot an ``alloc_extend`` / ``alloc_decode`` / ``alloc`` returns lies on a page of the lane that the
plan says computes the token (C-OWNER-EQ-COMPUTE); a ``None`` changes nothing (C-ATOMIC); the admission
floor ``available_size`` and the demand handed to SGLang's scheduler keep their promises.
"""

import copy

import numpy as np
import pytest
import torch
from sglang_workload import Side, Workload, i64

sgl = pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)

from cpkv import OWNER_POLICIES  # noqa: E402

pytestmark = pytest.mark.sglang

Allocator = sgl.OwnerLaneTokenToKVPoolAllocator


def make(C, P, rank_pages, policy, need_sort=False):
    return Allocator(
        rank_pages * P, P, torch.bfloat16, "cpu", None, need_sort, cp_size=C, owner_policy=policy
    )


def state(alloc) -> tuple:
    """Everything a failed call must leave as it was: free pages (and their order), floor, plan."""
    return (
        alloc.lanes.state_digest(),
        alloc.get_all_free_pages().tolist(),
        alloc.available_size(),
        alloc.last_plan,
    )


def lane_floor(alloc) -> int:
    """``available_size`` recomputed from the free page ids: C * P * min over lanes of free pages."""
    C = alloc.cp_size
    per_lane = np.bincount(alloc.get_all_free_pages().numpy() % C, minlength=C)
    return C * alloc.page_size * int(per_lane.min())


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@pytest.mark.clause("C-ATOMIC")
@pytest.mark.parametrize("policy", OWNER_POLICIES)
@pytest.mark.parametrize("C,need_sort", [(2, False), (4, False), (4, True)])
def test_every_slot_is_on_its_computing_rank_and_none_changes_nothing(C, need_sort, policy):
    P, rank_pages = 4, 12
    side = Side(make(C, P, rank_pages, policy, need_sort))
    alloc = side.alloc
    work = Workload(seed=7 * C + len(policy), page_size=P, max_extend=6 * P)
    served = nones = 0
    for _ in range(1000):
        op = work.draw()
        before = state(alloc)
        demand = None
        if op[0] == "extend":
            prefix = [len(side.rows.get(rid, [])) for rid, _ in op[1]]
            seq = [p + e for p, (_, e) in zip(prefix, op[1], strict=True)]
            demand = alloc.get_extend_allocation_demand(
                i64(prefix), i64(seq), conservative_num_tokens=0, shard_size=1
            )
        got = side.apply(op)
        if got is None:
            nones += 1
            after = state(alloc)
            if need_sort:  # staged pages went back to their lanes; the free set and the floor did not change
                assert after[1:] == before[1:]
            else:
                assert after == before
            assert demand is None or alloc.available_size() < demand  # the demand promised no fit
        elif op[0] in ("extend", "decode", "alloc"):
            served += 1
            out = np.asarray(sum(got, []), dtype=np.int64)
            plan = alloc.last_plan
            assert ((out // P) % C).tolist() == plan.token_owner.tolist()
            assert alloc.layout.lane_of(torch.from_numpy(out)).tolist() == plan.token_owner.tolist()
            new_pages = out[out % P == 0] // P  # a new page starts at offset 0; a head never does
            assert (new_pages % C).tolist() == plan.page_owners.tolist()  # page order
        work.commit(op, got)
        live = side.live_slots()
        assert np.unique(live).shape[0] == live.shape[0]
        assert ((live // P >= C) & (live // P < C * (rank_pages + 1))).all()  # no padding or foreign page
        free = set(alloc.get_all_free_pages().tolist())
        assert free.isdisjoint(live // P) and len(free | set((live // P).tolist())) == alloc.num_pages
        assert alloc.available_size() == lane_floor(alloc) and alloc.aggregate_free_size() == P * len(free)
    assert served >= 300 and nones >= 10


@pytest.mark.clause("C-ATOMIC")
@pytest.mark.parametrize("policy", OWNER_POLICIES)
def test_a_short_lane_returns_none_although_other_lanes_have_room(policy):
    """C=2, P=4, 4 pages a rank: lane 0 hands out pages 2, 4, 6, 8 and lane 1 pages 3, 5, 7, 9."""
    C, P = 2, 4
    alloc = make(C, P, 4, policy)
    chain = alloc.alloc(8 * P)  # all 8 pages, 4 a lane whatever the phase
    assert sorted(set((chain // P).tolist())) == list(range(2, 10))
    alloc.free_page_ids(torch.tensor([3, 5]))  # lane 1 only: pages 3, 5 free, lane 0 none
    assert alloc.available_size() == 0
    before, twin = state(alloc), copy.deepcopy(alloc)
    t = torch.tensor
    assert alloc.alloc_extend(t([0]), t([0]), t([8]), t([8]), t([-1]), 8) is None  # 2 pages: one per lane
    assert state(alloc) == before
    one_page = (t([0]), t([0]), t([3]), t([3]), t([-1]), 3)
    out = alloc.alloc_extend(*one_page)
    if policy == "balanced":  # phase = the lane with the most free pages
        assert out.tolist() == [12, 13, 14] and alloc.last_plan.request_phases.tolist() == [1]
    else:  # rotation (prefix 0, request 0) and legacy both start at lane 0, which is empty
        assert out is None and state(alloc) == before
    assert (twin.alloc_extend(*one_page) is None) == (out is None)  # the failed call left no trace


@pytest.mark.parametrize("policy", OWNER_POLICIES)
@pytest.mark.parametrize("C", [1, 2, 4])
def test_extend_demand_guarantees_the_batch_fits(C, policy):
    """Whenever ``available_size() >= get_extend_allocation_demand(...)`` the batch is served."""
    P = 4
    alloc = make(C, P, 10, policy)
    rng = np.random.default_rng(C)
    for _ in range(300):
        B = int(rng.integers(1, 4))
        prefix, extend = [0] * B, rng.integers(1, 6 * P, size=B).tolist()
        conservative = sum(extend) + B * P  # what SGLang's scheduler computes for this batch
        demand = alloc.get_extend_allocation_demand(
            i64(prefix), i64(extend), conservative_num_tokens=conservative, shard_size=1
        )
        assert demand >= conservative and (C > 1 or demand == conservative)
        fits = alloc.available_size() >= demand
        out = alloc.alloc_extend(
            i64(prefix), i64(prefix), i64(extend), i64(extend), i64([-1] * B), sum(extend)
        )
        assert out is not None or not fits
        if out is not None and rng.random() < 0.6:
            alloc.free(out)
