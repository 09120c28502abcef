"""Speculative draft pages (SPEC C-DRAFT): ``alloc_draft``, ``release_tail``, per-rank KV lengths.

Hand-computed cases from the SPEC text (arithmetic in the comments), a differential test of
``alloc_draft`` against ``alloc_extend`` on random allocator states, and hypothesis over C, P, k and the
accepted count for one draft-and-rollback round. Page p lives on lane p % C; a fresh allocator hands out
the lowest free ids of each lane first, never page 0.
"""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import oracle
from allocator_state import snapshot
from cpkv import (
    AllocatorError,
    CPConfig,
    LaneExhausted,
    OwnerLaneAllocator,
    rank_kv_lens,
    verify_rank_kv_lens,
)

pytestmark = pytest.mark.unit

POLICIES = ("rotation", "legacy", "balanced")


def prefilled(policy="rotation"):
    """C=4, P=4, Q=8, request A prefilled with 6 tokens: pages [4, 1] (lanes 0, 1), last_loc 5.

    L0=0, E=6: m=2 pages in segments 0 and 1 -> zigzag ranks 0, 1, phase 0 (rotation; balanced ties on
    the spread and falls back to rotation) -> lanes 0, 1 -> pages 4 (lane 0 skips page 0) and 1;
    positions 0..3 at slots 16..19, positions 4, 5 at slots 4, 5.
    """
    alloc = OwnerLaneAllocator(CPConfig(4, 4, policy), 8)
    res = alloc.alloc_extend([0], [6], [-1])
    assert res.new_pages.tolist() == [4, 1] and res.out_cache_loc.tolist()[-1] == 5
    return alloc


# ----------------------------------------------------------------------------------------------------
# Hand-computed examples
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-DRAFT")
def test_draft_fills_the_head_page_then_takes_a_page_on_the_phase_lane():
    # seq_len=6, k=3: positions 6, 7 go into page 1 (slots 6, 7); position 8 starts a new page. Rotation
    # phase = (6 // 4 + 0) % 4 = 1; one page is segment 0 -> lane (0 + 1) % 4 = 1, whose next free page is 5
    # (slot 20).
    alloc = prefilled()
    res = alloc.alloc_draft([6], [5], 3)
    assert res.out_cache_loc.tolist() == [6, 7, 20]
    assert res.new_pages.tolist() == [5]
    assert res.plan.request_phases.tolist() == [1]
    assert res.out_cache_loc.dtype == torch.int64
    assert alloc.free_pages_per_lane().tolist() == [6, 6, 8, 8]  # usable [7, 8, 8, 8] minus [1, 2, 0, 0]


@pytest.mark.clause("C-DRAFT")
@pytest.mark.parametrize(
    ("new_len", "freed", "kept_lens"),
    [
        # Pages [4, 1, 5] hold positions 0..3, 4..7, 8..11. Page 5's first position is 8.
        (6, [5], [4, 2, 0, 0]),  # nothing accepted: positions 6..8 rejected, page 5 goes back
        (8, [5], [4, 4, 0, 0]),  # 6, 7 kept; page 5 starts at 8 = new_len -> freed
        (9, [], [4, 5, 0, 0]),  # 8 kept: page 5 holds a kept token and stays
    ],
)
def test_release_tail_frees_pages_starting_at_or_after_new_len(new_len, freed, kept_lens):
    alloc = prefilled()
    alloc.alloc_draft([6], [5], 3)
    before = alloc.free_pages_per_lane()
    out = alloc.release_tail([4, 1, 5], new_len)
    assert out.tolist() == freed and out.dtype == np.int64
    gained = [1 if r == 1 and freed else 0 for r in range(4)]  # page 5 is on lane 5 % 4 = 1
    assert (alloc.free_pages_per_lane() - before).tolist() == gained
    assert alloc.is_free([5]).tolist() == [bool(freed)]
    assert alloc.is_free([4, 1]).tolist() == [False, False]
    # Per-rank lengths from the new length and the pages (either list: a freed page adds nothing).
    assert rank_kv_lens([4, 1, 5], new_len, CPConfig(4, 4)).tolist() == kept_lens
    assert rank_kv_lens([4, 1, 5][: -(-new_len // 4)], new_len, CPConfig(4, 4)).tolist() == kept_lens


@pytest.mark.clause("C-DRAFT")
def test_rollback_then_next_draft_overwrites_rejected_rows():
    # Keep 7 tokens (position 6 at slot 6); the next draft of k=2 starts at position 7: slot 7 again (the
    # rejected row) and position 8 on a new page: phase (7 // 4) % 4 = 1 -> lane 1, which got page 5 back.
    alloc = prefilled()
    alloc.alloc_draft([6], [5], 3)
    assert alloc.release_tail([4, 1, 5], 7).tolist() == [5]
    res = alloc.alloc_draft([7], [6], 2)
    assert res.out_cache_loc.tolist() == [7, 20] and res.new_pages.tolist() == [5]


@pytest.mark.clause("C-DRAFT")
def test_legacy_piles_draft_pages_on_lane_0_rotation_spreads_them():
    # Four requests, each at seq_len 4 (one full page), draft k=2: positions 4, 5 start a new page each.
    # legacy: phase 0 -> lane 0 for all four. rotation: phase (4 // 4 + i) % 4 = 1, 2, 3, 0.
    for policy, lanes in (("legacy", [0, 0, 0, 0]), ("rotation", [1, 2, 3, 0])):
        alloc = OwnerLaneAllocator(CPConfig(4, 4, policy), 16)
        pre = alloc.alloc_extend([0] * 4, [4] * 4, [-1] * 4)
        lasts = [int(p) * 4 + 3 for p in pre.new_pages]
        res = alloc.alloc_draft([4] * 4, lasts, 2)
        assert (res.new_pages % 4).tolist() == lanes


@pytest.mark.clause("C-DRAFT")
def test_balanced_draft_takes_the_freer_lane():
    # C=2, P=1, Q=4: usable lanes [3 (pages 2, 4, 6), 4 (pages 1, 3, 5, 7)]. Prefill L0=0, E=2: n = [1, 1]
    # under either phase, a tie -> rotation phase 0 -> pages [2, 1], free [2, 3]. Draft k=1 at seq_len 2:
    # phase 0 would leave [1, 3] (tightest 1), phase 1 leaves [2, 2] (tightest 2) -> lane 1, page 3.
    # Rotation takes phase (2 + 0) % 2 = 0 -> lane 0, page 4.
    for policy, page in (("balanced", 3), ("rotation", 4)):
        alloc = OwnerLaneAllocator(CPConfig(2, 1, policy), 4)
        assert alloc.alloc_extend([0], [2], [-1]).new_pages.tolist() == [2, 1]
        res = alloc.alloc_draft([2], [1], 1)
        assert res.new_pages.tolist() == [page] and res.out_cache_loc.tolist() == [page]


@pytest.mark.clause("C-DRAFT")
def test_verify_queries_see_one_more_position_each():
    # Pages [4, 1, 5] (lanes 0, 1, 1), seq_len 6, k=3: query j sees 7 + j positions. Positions 0..3 on lane
    # 0; 4, 5, 6 (query 0), 7 (query 1) on lane 1 via page 1; 8 (query 2) on lane 1 via page 5.
    lens = verify_rank_kv_lens([4, 1, 5], 6, 3, CPConfig(4, 4))
    assert lens.tolist() == [[4, 3, 0, 0], [4, 4, 0, 0], [4, 5, 0, 0]]
    assert lens.dtype == np.int64 and lens.sum(axis=1).tolist() == [7, 8, 9]


@pytest.mark.clause("C-DRAFT")
def test_draft_is_atomic():
    # C=2, P=1, Q=2: usable [1 (page 2), 2 (pages 1, 3)]. Two one-token requests: phases (0 + i) % 2 -> lanes
    # 0, 1 -> pages 2, 1; free [0, 1]. A draft of k=2 for both: 2 pages each, one per lane under either
    # phase -> 2 pages on lane 0, which has 0 -> LaneExhausted(0, 2, 0), nothing taken.
    alloc = OwnerLaneAllocator(CPConfig(2, 1, "rotation"), 2)
    assert alloc.alloc_extend([0, 0], [1, 1], [-1, -1]).new_pages.tolist() == [2, 1]
    before = snapshot(alloc)
    with pytest.raises(LaneExhausted) as info:
        alloc.alloc_draft([1, 1], [2, 1], 2)
    assert (info.value.lane, info.value.needed, info.value.available) == (0, 2, 0)
    assert snapshot(alloc) == before


# ----------------------------------------------------------------------------------------------------
# Errors: typed, naming the value, nothing changes
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-DRAFT")
@pytest.mark.parametrize(
    ("pages", "new_len", "match"),
    [
        ([4, 1, 5], 13, r"new_len=13 out of range \[0, 12\]"),  # beyond the pages: 3 pages of 4 tokens
        ([4, 1, 5], -1, r"new_len=-1 out of range"),
        ([4, 1, 5], 2.0, r"new_len must be an integer, got 2.0"),
        ([4, 1, 5], True, r"new_len must be an integer, got True"),
        ([4, 1, 2], 6, r"page 2: it is already free"),  # page 2 was never handed out
        ([4, 1, 5, 5], 6, r"page 5: listed more than once"),
        ([0, 1, 5], 6, r"page 0: it is reserved"),
        ([4, 1, 32], 6, r"page id 32 out of range \[0, 32\)"),  # C*Q = 32 page ids
        ([4, 1, -3], 6, r"page id -3 out of range"),
        ([4, 1, 4.5], 6, r"pages must hold integers"),
    ],
)
def test_release_tail_errors_change_nothing(pages, new_len, match):
    alloc = prefilled()
    alloc.alloc_draft([6], [5], 3)
    before = snapshot(alloc)
    with pytest.raises(AllocatorError, match=match):
        alloc.release_tail(pages, new_len)
    assert snapshot(alloc) == before


@pytest.mark.clause("C-DRAFT")
@pytest.mark.parametrize("k", [0, -1, 1.5, True, None])
def test_alloc_draft_rejects_bad_k(k):
    alloc = prefilled()
    before = snapshot(alloc)
    with pytest.raises(AllocatorError, match=r"num_draft_tokens must be (an integer|>= 1), got"):
        alloc.alloc_draft([6], [5], k)
    assert snapshot(alloc) == before


def test_alloc_draft_bad_last_loc_raises_as_alloc_extend():
    alloc = prefilled()
    before = snapshot(alloc)
    with pytest.raises(AllocatorError, match=r"request 0: last_loc=4 is inconsistent with prefix_len=6"):
        alloc.alloc_draft([6], [4], 2)
    assert snapshot(alloc) == before


# ----------------------------------------------------------------------------------------------------
# Differential: alloc_draft == alloc_extend(seq_lens, [k] * B, last_locs)
# ----------------------------------------------------------------------------------------------------


def _twin_allocators(data, C, P, policy):
    """Two allocators brought to the same random state (prefills and frees), and the live requests."""
    unequal = data.draw(st.booleans(), label="unequal")
    caps = data.draw(st.lists(st.integers(2, 8), min_size=C, max_size=C), label="caps") if unequal else 6
    allocs = [OwnerLaneAllocator(CPConfig(C, P, policy), caps) for _ in range(2)]
    live = []  # (seq_len, last_loc, pages)
    for _ in range(data.draw(st.integers(0, 6), label="prefills")):
        E = data.draw(st.integers(1, 3 * P + 1), label="E")
        try:
            res = [a.alloc_extend([0], [E], [-1]) for a in allocs]
        except LaneExhausted:
            continue
        live.append((E, int(res[0].out_cache_loc[-1]), res[0].new_pages.tolist()))
        if data.draw(st.booleans(), label="free_one") and live:
            _, _, pages = live.pop(data.draw(st.integers(0, len(live) - 1), label="which"))
            for a in allocs:
                a.free(pages)
    return allocs, live


@pytest.mark.clause("C-DRAFT")
@given(
    C=st.integers(1, 6), P=st.sampled_from([1, 2, 4, 16]), policy=st.sampled_from(POLICIES), data=st.data()
)
@hsettings(max_examples=150, deadline=None)
def test_alloc_draft_equals_alloc_extend(C, P, policy, data):
    allocs, live = _twin_allocators(data, C, P, policy)
    batch = data.draw(st.lists(st.sampled_from(live), max_size=5), label="batch") if live else []
    batch = [b for i, b in enumerate(batch) if b not in batch[:i]]  # a request once per batch
    batch += [(0, -1, [])] * data.draw(st.integers(0, 1), label="fresh")  # a request with nothing cached
    k = data.draw(st.integers(1, 2 * P + 2), label="k")
    seq, lasts = [b[0] for b in batch], [b[1] for b in batch]
    results = []
    for a, call in zip(
        allocs,
        (lambda a: a.alloc_draft(seq, lasts, k), lambda a: a.alloc_extend(seq, [k] * len(seq), lasts)),
        strict=True,
    ):
        try:
            r = call(a)
        except LaneExhausted as e:
            results.append(("exhausted", e.lane, e.needed, e.available))
        else:
            results.append(
                (
                    "ok",
                    r.new_pages.tolist(),
                    r.out_cache_loc.tolist(),
                    r.plan.request_phases.tolist(),
                    r.plan.page_owners.tolist(),
                )
            )
    assert results[0] == results[1]
    assert snapshot(allocs[0]) == snapshot(allocs[1])
    if results[0][0] == "ok":
        assert len(results[0][2]) == k * len(batch)


# ----------------------------------------------------------------------------------------------------
# One draft-and-rollback round over C, P, k and the accepted count
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-DRAFT")
@given(
    C=st.integers(1, 8),
    P=st.sampled_from([1, 2, 3, 4, 8, 64]),
    policy=st.sampled_from(POLICIES),
    prompt=st.integers(1, 300),
    k=st.integers(1, 10),
    data=st.data(),
)
@hsettings(max_examples=200, deadline=None)
def test_draft_then_rollback_keeps_exactly_the_pages_of_kept_positions(C, P, policy, prompt, k, data):
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy), 400 // C + 4)
    pre = alloc.alloc_extend([0], [prompt], [-1])
    slots = pre.out_cache_loc.tolist()
    draft = alloc.alloc_draft([prompt], [slots[-1]], k)
    slots += draft.out_cache_loc.tolist()
    pages = pre.new_pages.tolist() + draft.new_pages.tolist()
    # Position order: position t sits on page t // P of the request's list (oracle slot arithmetic).
    assert [s // P for s in slots] == [pages[t // P] for t in range(prompt + k)]
    n = data.draw(st.integers(0, k), label="accepted")
    new_len = prompt + n
    free_before = alloc.free_pages_per_lane()
    freed = alloc.release_tail(pages, new_len).tolist()
    keep = [p for i, p in enumerate(pages) if i * P < new_len]  # first position i*P below new_len
    assert freed == [p for p in pages if p not in keep]
    assert set(freed) <= set(draft.new_pages.tolist())  # never a page of the cached prefix
    assert alloc.is_free(freed).all() and not alloc.is_free(keep).any()
    gained = [sum(1 for p in freed if p % C == r) for r in range(C)]
    assert (alloc.free_pages_per_lane() - free_before).tolist() == gained
    # Per-rank lengths: recomputed from new_len and the pages, equal to a position-by-position count.
    expect = [0] * C
    for t in range(new_len):
        expect[oracle.lane_of(slots[t], C, P)] += 1
    assert rank_kv_lens(keep, new_len, CPConfig(C, P)).tolist() == expect
    assert sum(expect) == new_len
    rows = verify_rank_kv_lens(pages, prompt, k, CPConfig(C, P))
    if n:
        assert rows[n - 1].tolist() == expect  # query n-1 saw exactly the positions now kept
