"""Hand-computed allocator cases (SPEC section 7, C-ALLOC, C-BALANCED), arithmetic in the comments.

Page p lives on lane p % C; a fresh allocator hands out the lowest free ids of each lane first and never
page 0. Every expectation below is derived by hand from the SPEC text, not copied from the code.
"""

import numpy as np
import pytest
import torch

import oracle
from cpkv import CPConfig, LaneExhausted, OwnerLaneAllocator

pytestmark = pytest.mark.unit


def slots_of_pages(pages: list[int], page_size: int, total: int) -> list[int]:
    """Plain-Python expectation: p*P + 0 .. P-1 for each page in order, cut at ``total`` tokens."""
    out: list[int] = []
    for p in pages:
        out.extend(p * page_size + o for o in range(page_size))
    return out[:total]


# ----------------------------------------------------------------------------------------------------
# SPEC worked example
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-ALLOC")
def test_spec_worked_example_pages_and_slots():
    # C=4, P=64, Q=8, fresh, L0=0, E=1000, rotation: phase 0, owners [0,0,1,1,2,2,3,3,3,3,2,2,1,1,0,0].
    # Free lanes (ascending): lane 0 = 4, 8, 12, 16, ... (page 0 reserved); lane 1 = 1, 5, 9, 13;
    # lane 2 = 2, 6, 10, 14; lane 3 = 3, 7, 11, 15. Taking them in owner order:
    # 0->4, 0->8, 1->1, 1->5, 2->2, 2->6, 3->3, 3->7, 3->11, 3->15, 2->10, 2->14, 1->9, 1->13, 0->12, 0->16.
    alloc = OwnerLaneAllocator(CPConfig(4, 64, "rotation"), 8)
    res = alloc.alloc_extend([0], [1000], [-1])
    pages = [4, 8, 1, 5, 2, 6, 3, 7, 11, 15, 10, 14, 9, 13, 12, 16]
    assert res.new_pages.tolist() == pages
    assert res.new_pages.dtype == np.int64
    out = res.out_cache_loc.tolist()
    # out_cache_loc starts 256..319 (page 4), 512..575 (page 8), 64..127 (page 1).
    assert out[:64] == list(range(256, 320))
    assert out[64:128] == list(range(512, 576))
    assert out[128:192] == list(range(64, 128))
    # Whole thing: 15 full pages (960 tokens) + the last page (16) up to 1000 tokens: 40 slots 1024..1063.
    assert len(out) == 1000
    assert out == slots_of_pages(pages, 64, 1000)
    assert out[-40:] == list(range(16 * 64, 16 * 64 + 40))
    # 4 pages per lane were taken; lane 0 had 7 usable, the others 8.
    assert alloc.free_pages_per_lane().tolist() == [3, 4, 4, 4]
    assert alloc.used_pages_per_lane().tolist() == [4, 4, 4, 4]


@pytest.mark.clause("C-ALLOC")
def test_out_cache_loc_is_int64_on_the_allocator_device():
    for device in ("cpu", torch.device("cpu")):
        alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 4, device=device)
        res = alloc.alloc_extend([0, 0], [5, 0], [-1, -1])
        assert isinstance(res.out_cache_loc, torch.Tensor)
        assert res.out_cache_loc.dtype == torch.int64
        assert res.out_cache_loc.device == torch.device("cpu")
        assert res.out_cache_loc.shape == (5,)
    # Empty batch: an empty int64 tensor, nothing allocated.
    alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 4)
    res = alloc.alloc_extend([], [], [])
    assert res.out_cache_loc.dtype == torch.int64 and res.out_cache_loc.numel() == 0
    assert res.new_pages.size == 0
    assert alloc.free_pages_per_lane().tolist() == [3, 4]


# ----------------------------------------------------------------------------------------------------
# lowest ids first, page 0 reserved
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-ALLOC")
def test_fresh_allocator_takes_lowest_ids_per_lane():
    # C=4, Q=4: lane 0 = 4, 8, 12; lane 1 = 1, 5, 9, 13; lane 2 = 2, 6, ...; lane 3 = 3, 7, ...
    # owners [0,0,1,2,3,3,1,0] -> 4, 8, 1, 2, 3, 7, 5, 12.
    alloc = OwnerLaneAllocator(CPConfig(4, 16, "rotation"), 4)
    owners = [0, 0, 1, 2, 3, 3, 1, 0]
    pages = alloc.alloc_pages(owners)
    assert pages.tolist() == [4, 8, 1, 2, 3, 7, 5, 12]
    assert pages.tolist() == oracle.fresh_alloc_pages(owners, 4, 4)
    assert (pages % 4).tolist() == owners
    assert alloc.free_pages_per_lane().tolist() == [0, 2, 3, 2]
    assert alloc.is_free([4, 8, 12, 1, 5, 9, 13]).tolist() == [False, False, False, False, False, True, True]


@pytest.mark.clause("C-ALLOC")
@pytest.mark.parametrize("cp_size", [1, 2, 3, 8])
def test_page_zero_is_never_handed_out(cp_size):
    # Drain every lane one page at a time: all ids 1 .. C*Q-1 come out, each once, never 0.
    Q = 5
    alloc = OwnerLaneAllocator(CPConfig(cp_size, 2, "rotation"), Q)
    assert alloc.free_pages_per_lane().tolist() == [Q - 1] + [Q] * (cp_size - 1)
    assert not alloc.is_free([0])[0]
    taken = []
    for r in range(cp_size):
        for _ in range(Q - (1 if r == 0 else 0)):
            taken.extend(alloc.alloc_pages([r]).tolist())
    assert sorted(taken) == list(range(1, cp_size * Q))
    assert alloc.total_free_pages == 0
    with pytest.raises(LaneExhausted) as info:
        alloc.alloc_pages([0])
    assert (info.value.lane, info.value.needed, info.value.available) == (0, 1, 0)


@pytest.mark.clause("C-ALLOC")
def test_cp1_fresh_request_skips_page_zero():
    # C=1, P=4, Q=4: the only lane holds pages 1, 2, 3; L0=0, E=9 -> 3 pages 1, 2, 3 -> slots 4..12.
    alloc = OwnerLaneAllocator(CPConfig(1, 4, "legacy"), 4)
    res = alloc.alloc_extend([0], [9], [-1])
    assert res.new_pages.tolist() == [1, 2, 3]
    assert res.out_cache_loc.tolist() == list(range(4, 13))


@pytest.mark.clause("C-ALLOC")
def test_freed_pages_are_reused():
    alloc = OwnerLaneAllocator(CPConfig(2, 1, "rotation"), 3)  # lane 0: 2, 4; lane 1: 1, 3, 5
    pages = alloc.alloc_pages([0, 0, 1])
    assert pages.tolist() == [2, 4, 1]
    alloc.free([4, 2])
    assert alloc.free_pages_per_lane().tolist() == [2, 2]
    again = alloc.alloc_pages([0, 0])
    assert sorted(again.tolist()) == [2, 4]
    assert alloc.free_pages_per_lane().tolist() == [0, 2]


# ----------------------------------------------------------------------------------------------------
# continuation and decode
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-ALLOC")
def test_unaligned_continuation_head_slots_then_new_pages():
    # C=4, P=64, Q=8. Request A: L0=0, E=100 -> m=2, phase 0, segments 0,1 -> owners [0, 1] -> pages 4, 1.
    # Slots: page 4 = 256..319 (64 tokens), page 1 = 64..99 (36 tokens). last_loc = 99.
    alloc = OwnerLaneAllocator(CPConfig(4, 64, "rotation"), 8)
    a = alloc.alloc_extend([0], [100], [-1])
    assert a.new_pages.tolist() == [4, 1]
    assert a.out_cache_loc.tolist() == list(range(256, 320)) + list(range(64, 100))
    # Continue: L0=100, E=200, last_loc=99 (page 1, lane 1 = head owner). Phase (100//64 + 0) % 4 = 1.
    # h = 64 - 36 = 28 head slots 100..127; then m = ceil(300/64) - ceil(100/64) = 5 - 2 = 3 pages,
    # owners [1, 2, 3] -> lane 1 next free = 5, lane 2 = 2, lane 3 = 3.
    # Slots: 100..127, page 5 = 320..383, page 2 = 128..191, page 3 = 192..235 (300 - 256 = 44 tokens).
    b = alloc.alloc_extend([100], [200], [99])
    assert b.plan.head_owners.tolist() == [1]
    assert b.plan.page_owners.tolist() == [1, 2, 3]
    assert b.new_pages.tolist() == [5, 2, 3]
    expected = list(range(100, 128)) + list(range(320, 384)) + list(range(128, 192)) + list(range(192, 236))
    assert b.out_cache_loc.tolist() == expected
    assert b.plan.per_rank_tokens.tolist() == [0, 92, 64, 44]


@pytest.mark.clause("C-ALLOC")
@pytest.mark.clause("C-PHASE")
def test_decode_takes_a_page_only_at_a_page_start_on_the_phase_lane():
    # C=4, P=4, Q=8, rotation. Fresh L0=0, E=4 -> 1 page, phase 0 -> lane 0 -> page 4, slots 16..19.
    alloc = OwnerLaneAllocator(CPConfig(4, 4, "rotation"), 8)
    assert alloc.alloc_extend([0], [4], [-1]).new_pages.tolist() == [4]
    # Decode at seq_len 4: position 4 starts page 1 of the request; phase (4//4 + 0) % 4 = 1 -> lane 1,
    # page 1, slot 4.
    d = alloc.alloc_decode([4], [19])
    assert d.new_pages.tolist() == [1]
    assert d.out_cache_loc.tolist() == [4]
    # seq_len 5, 6, 7: inside page 1 -> no new page, slots 5, 6, 7, free counts unchanged.
    before = alloc.free_pages_per_lane().tolist()
    for seq_len in (5, 6, 7):
        d = alloc.alloc_decode([seq_len], [seq_len - 1])
        assert d.new_pages.size == 0
        assert d.out_cache_loc.tolist() == [seq_len]
        assert d.plan.token_owner.tolist() == [1]  # the head owner (lane of page 1)
    assert alloc.free_pages_per_lane().tolist() == before
    # seq_len 8: starts request page 2; phase (8//4 + 0) % 4 = 2 -> lane 2, page 2, slot 8.
    d = alloc.alloc_decode([8], [7])
    assert d.new_pages.tolist() == [2]
    assert d.out_cache_loc.tolist() == [8]
    for seq_len in (9, 10, 11):  # inside page 2: slots 9, 10, 11
        assert alloc.alloc_decode([seq_len], [seq_len - 1]).out_cache_loc.tolist() == [seq_len]
    # A decode batch [seq_len 12, seq_len 4] (second request: fresh page 8 of lane 0 via alloc_pages):
    # request 0 phase (12//4 + 0) % 4 = 3 -> lane 3 page 3; request 1 phase (4//4 + 1) % 4 = 2 -> lane 2 page 6.
    # (Request 0's last_loc 11 is on page 2; request 1's last_loc is on page 8 = slots 32..35 -> 35.)
    assert alloc.alloc_pages([0]).tolist() == [8]
    d = alloc.alloc_decode([12, 4], [11, 35])
    assert d.plan.request_phases.tolist() == [3, 2]
    assert d.new_pages.tolist() == [3, 6]
    assert d.out_cache_loc.tolist() == [12, 24]


@pytest.mark.clause("C-ALLOC")
def test_decode_under_legacy_always_uses_lane_zero():
    # legacy: phase 0 always, so every page-starting decode goes to lane 0 (4, 8, 12, ...).
    alloc = OwnerLaneAllocator(CPConfig(4, 1, "legacy"), 4)  # P=1: every decode starts a page
    pages = []
    last = -1
    for seq_len in range(3):
        d = alloc.alloc_decode([seq_len], [last])
        pages += d.new_pages.tolist()
        last = int(d.out_cache_loc[0])
    assert pages == [4, 8, 12]
    with pytest.raises(LaneExhausted):
        alloc.alloc_decode([3], [last])


# ----------------------------------------------------------------------------------------------------
# unequal per-lane capacity
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-ALLOC")
def test_unequal_lane_capacity():
    # Q_r = [3, 5, 2, 4]: usable [2, 5, 2, 4] (page 0 on lane 0 reserved); ids run over 0 .. 4*5-1.
    alloc = OwnerLaneAllocator(CPConfig(4, 8, "rotation"), [3, 5, 2, 4])
    assert alloc.free_pages_per_lane().tolist() == [2, 5, 2, 4]
    assert alloc.min_free_pages == 2
    assert alloc.total_free_pages == 13
    # Lane 2 holds pages 2, 6 only (10 would be its local page 2 >= Q_2).
    assert alloc.alloc_pages([2, 2]).tolist() == [2, 6]
    assert alloc.min_free_pages == 0
    assert alloc.total_free_pages == 11
    with pytest.raises(LaneExhausted) as info:
        alloc.alloc_pages([1, 2])
    assert (info.value.lane, info.value.needed, info.value.available) == (2, 1, 0)
    assert alloc.free_pages_per_lane().tolist() == [2, 5, 0, 4]
    # Lane 1 has 5 pages: 1, 5, 9, 13, 17; a sixth is refused.
    assert alloc.alloc_pages([1] * 5).tolist() == [1, 5, 9, 13, 17]
    with pytest.raises(LaneExhausted) as info:
        alloc.alloc_pages([1])
    assert (info.value.lane, info.value.needed, info.value.available) == (1, 1, 0)
    # Lane 0: pages 4, 8; lane 3: 3, 7, 11, 15.
    assert alloc.alloc_pages([0, 3, 0, 3, 3, 3]).tolist() == [4, 3, 8, 7, 11, 15]
    assert alloc.total_free_pages == 0 and alloc.min_free_pages == 0
    alloc.free([6, 17])
    assert alloc.free_pages_per_lane().tolist() == [0, 1, 1, 0]
    assert alloc.total_free_pages == 2
