"""C-ATOMIC when the short lane is not lane 0: a call that some lane cannot serve takes nothing anywhere.

An allocator that took pages lane by lane and stopped at the first short lane would pass every case in
which lane 0 is the short one (nothing is taken before it). Here the short lane is lane 1, 2 or 3 while
the lanes before it have pages to give, through ``alloc_extend`` (general path and single-page path),
``alloc_decode`` and ``alloc_pages``, and in random cases checked against the independent oracle's page
owners. Every failing call is bracketed by a full snapshot of the allocator.
"""

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import oracle
from allocator_state import snapshot
from cpkv import CPConfig, LaneExhausted, OwnerLaneAllocator

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ATOMIC")]


def assert_exhausted_changes_nothing(alloc, call, lane, needed, available):
    before = snapshot(alloc)
    with pytest.raises(LaneExhausted) as info:
        call()
    assert (info.value.lane, info.value.needed, info.value.available) == (lane, needed, available)
    assert snapshot(alloc) == before


def test_extend_short_on_lane_2():
    # C=4, P=64, rotation, lanes of [5, 5, 3, 5] pages (usable [4, 5, 3, 5]). L0=0, E=1000: 16 pages,
    # owners [0,0,1,1,2,2,3,3,3,3,2,2,1,1,0,0] -> 4 per lane; lanes 0, 1 and 3 can give 4, lane 2 only 3.
    alloc = OwnerLaneAllocator(CPConfig(4, 64, "rotation"), [5, 5, 3, 5])
    assert_exhausted_changes_nothing(alloc, lambda: alloc.alloc_extend([0], [1000], [-1]), 2, 4, 3)


def test_batch_short_on_lane_3_after_a_request_that_fits():
    # C=4, P=16, rotation; E = [128, 80, 96, 16] with phases 0, 1, 2, 3 (req_index). Segments of 1 page on
    # zigzag ranks 0,1,2,3,3,2,1,0 (first m of them), lane = (z + phase) % 4:
    #   req 0 (8 pages): lanes 0,1,2,3,3,2,1,0; req 1 (5): 1,2,3,0,0; req 2 (6): 2,3,0,1,1,0; req 3 (1): 3.
    # Needs per lane [6, 5, 4, 5]; lanes of [9, 9, 9, 4] pages (usable [8, 9, 9, 4]): only lane 3 is short.
    alloc = OwnerLaneAllocator(CPConfig(4, 16, "rotation"), [9, 9, 9, 4])
    L0, E, last = [0, 0, 0, 0], [128, 80, 96, 16], [-1] * 4
    assert_exhausted_changes_nothing(alloc, lambda: alloc.alloc_extend(L0, E, last), 3, 5, 4)
    assert alloc.alloc_extend(L0[:3], E[:3], last[:3]).new_pages.shape[0] == 8 + 5 + 6  # without it: fits


def test_single_page_batch_short_on_lane_1():
    # C=2, P=4, legacy: every new page on lane 0, so use rotation: one-page requests i=0..3 of a batch get
    # phases 0, 1, 0, 1 -> lanes 0, 1, 0, 1. Lanes of [4, 2] pages (usable [3, 2]); first take lane 1's
    # page 1 so only page 3 is left there: lane 0 can give 2, lane 1 needs 2 but has 1.
    alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), [4, 2])
    assert alloc.alloc_pages([1]).tolist() == [1]
    call = lambda: alloc.alloc_extend([0, 0, 0, 0], [4, 3, 2, 1], [-1] * 4)  # noqa: E731
    assert_exhausted_changes_nothing(alloc, call, 1, 2, 1)


def test_decode_short_on_lane_2():
    # C=4, P=4, rotation: requests holding 4, 4, 8 tokens (pages taken by one prefill each, fresh: phase 0,
    # one page per 4 tokens on lanes 0, then lanes 0, 1). Decode at seq_lens [4, 4, 8]: every token starts
    # a page; phases (4//4 + 0) % 4 = 1, (4//4 + 1) % 4 = 2, (8//4 + 2) % 4 = 0 -> lanes 1, 2, 0.
    # Lane 2 holds one page (page 2) and we take it first: lane 2 is short while lanes 0 and 1 have pages.
    alloc = OwnerLaneAllocator(CPConfig(4, 4, "rotation"), [8, 8, 1, 8])
    last = [int(alloc.alloc_extend([0], [n], [-1]).out_cache_loc[-1]) for n in (4, 4, 8)]
    alloc.alloc_pages([2])
    assert alloc.free_pages_per_lane()[2] == 0
    assert_exhausted_changes_nothing(alloc, lambda: alloc.alloc_decode([4, 4, 8], last), 2, 1, 0)


def test_alloc_pages_short_on_lane_3():
    alloc = OwnerLaneAllocator(CPConfig(4, 4, "rotation"), [3, 3, 3, 2])  # usable [2, 3, 3, 2]
    assert_exhausted_changes_nothing(alloc, lambda: alloc.alloc_pages([0, 1, 2, 3, 3, 3]), 3, 3, 2)


@given(
    C=st.integers(2, 6),
    P=st.sampled_from([1, 4, 16]),
    policy=st.sampled_from(["rotation", "legacy", "balanced"]),
    caps=st.lists(st.integers(1, 8), min_size=6, max_size=6),
    held=st.lists(st.integers(0, 5), max_size=10),
    lens=st.lists(st.integers(0, 80), min_size=1, max_size=4),
    strategy=st.sampled_from(["zigzag", "interleave"]),
)
@hsettings(max_examples=200, deadline=None)
def test_any_short_lane_takes_nothing(C, P, policy, caps, held, lens, strategy):
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy, strategy), caps[:C])
    for r in held:  # some pages already taken, on any lanes
        if alloc.free_pages_per_lane()[r % C]:
            alloc.alloc_pages([r % C])
    free = alloc.free_pages_per_lane().tolist()
    need = [0] * C
    phases = (
        oracle.balanced_phases([0] * len(lens), lens, C, P, free, strategy) if policy == "balanced" else None
    )
    for i, E in enumerate(lens):  # the oracle's page owners (C-BALANCED sees the earlier requests' pages)
        phase = phases[i] if phases else None
        for r in oracle.plan_request(0, E, C, P, i, phase=phase, policy=policy, strategy=strategy)[
            "page_owners"
        ]:
            need[r] += 1
    short = [r for r in range(C) if need[r] > free[r]]
    if not short:
        alloc.alloc_extend([0] * len(lens), lens, [-1] * len(lens))
        return
    r = short[0]
    call = lambda: alloc.alloc_extend([0] * len(lens), lens, [-1] * len(lens))  # noqa: E731
    assert_exhausted_changes_nothing(alloc, call, r, need[r], free[r])
