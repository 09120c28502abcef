"""The page-aligned path (``cpkv/allocator/aligned.py``: small batches whose prefixes end on page boundaries)
against the general path.

Differential, as for the single-page path: the same state and call go through ``alloc_extend`` (which takes
the page-aligned path first) and through the general path (``_alloc_planned``) on a deep copy; ``out_cache_loc``,
``new_pages``, every field of the plan and the state afterwards must be bit for bit the same, and bad input
must raise the general path's error with nothing changed. Cases: every owner policy, both CP strategies (the
path takes zigzag only), cp_size 1..8, page sizes 1..64, unequal lanes, pages held, new and continued chains,
requests of 0..5C pages, short lanes and bad ``last_loc`` / lengths.
"""

import copy

import numpy as np
import pytest
import torch
from hypothesis import event, given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from test_allocator_one_page import as_form, assert_same_plan

from allocator_state import snapshot
from cpkv import CPConfig, CpkvError, OwnerLaneAllocator
from cpkv.allocator.aligned import MAX_REQUESTS, pick_aligned

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ALLOC", "C-ATOMIC", "C-BALANCED", "C-FAIL-FAST")]

BAD = (
    "negative_prefix",
    "free_page",
    "off_boundary",
    "fresh_with_last",
    "missing_last",
    "out_of_range",
    "page_zero",
)


@st.composite
def aligned_calls(draw):
    """An allocator with some pages held, and a batch of 1..MAX_REQUESTS + 2 requests with page-aligned
    prefixes (new chains, or chains ending on a held page), maybe one bad."""
    C = draw(st.integers(1, 8), label="C")
    P = draw(st.sampled_from([1, 2, 4, 16, 64]), label="P")
    policy = draw(st.sampled_from(("rotation", "legacy", "balanced")), label="policy")
    strategy = draw(st.sampled_from(["zigzag", "zigzag", "interleave"]), label="cp_strategy")
    caps = draw(st.lists(st.integers(1, 24), min_size=C, max_size=C), label="caps")
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy, strategy), caps)
    held = []
    for _ in range(draw(st.integers(0, 16), label="held")):
        lanes = np.flatnonzero(alloc.free_pages_per_lane()).tolist()
        if lanes:
            held += alloc.alloc_pages([draw(st.sampled_from(lanes))]).tolist()
    L0s, Es, lasts = [], [], []
    for _ in range(draw(st.integers(1, MAX_REQUESTS + 2), label="B")):
        if held and draw(st.booleans(), label="continued"):
            L0s.append(draw(st.integers(1, 40)) * P)
            lasts.append(draw(st.sampled_from(held)) * P + P - 1)
        else:
            L0s.append(0)
            lasts.append(-1)
        Es.append(draw(st.integers(0, 5 * C * P), label="E"))
    if draw(st.integers(0, 5), label="bad") == 0:
        i = draw(st.integers(0, len(L0s) - 1))
        kind = draw(st.sampled_from(BAD))
        free = np.flatnonzero(alloc.is_free(np.arange(alloc.num_pages))).tolist()
        if kind == "negative_prefix":
            L0s[i] = -P
        elif kind == "free_page" and free:
            L0s[i], lasts[i] = P, draw(st.sampled_from(free)) * P + P - 1
        elif kind == "off_boundary" and P > 1 and lasts[i] >= 0:
            lasts[i] -= 1
        elif kind == "fresh_with_last" and held:
            L0s[i], lasts[i] = 0, held[0] * P + P - 1
        elif kind == "missing_last":
            L0s[i], lasts[i] = P, -1
        elif kind == "out_of_range":
            L0s[i], lasts[i] = P, alloc.num_pages * P + P - 1
        elif kind == "page_zero":
            L0s[i], lasts[i] = P, P - 1
        event(f"bad input: {kind}")
    form = draw(st.sampled_from(["list", "numpy", "tensor"]), label="form")
    return alloc, L0s, Es, lasts, form


@pytest.mark.slow
@given(data=st.data())
@hsettings(max_examples=400, deadline=None)
def test_aligned_path_equals_general_path(data):
    alloc, L0s, Es, lasts, form = data.draw(aligned_calls())
    cfg = alloc.config
    note(
        f"C={cfg.cp_size} P={cfg.page_size} {cfg.owner_policy} {cfg.cp_strategy} caps={alloc.lane_pages.tolist()}"
    )
    note(f"L0={L0s} E={Es} last={lasts} form={form}")
    general = copy.deepcopy(alloc)
    before = snapshot(alloc)
    probe = pick_aligned(copy.deepcopy(alloc).pool, cfg, L0s, Es, lasts)
    want = want_err = got = got_err = None
    try:
        want = general._alloc_planned(L0s, Es, lasts)
    except CpkvError as e:
        want_err = e
    try:
        got = alloc.alloc_extend(as_form(L0s, form), as_form(Es, form), as_form(lasts, form))
    except CpkvError as e:
        got_err = e
    if want_err is not None:
        assert probe is None
        assert type(got_err) is type(want_err) and str(got_err) == str(want_err)
        assert snapshot(alloc) == before
        event(f"refused: {type(want_err).__name__}")
        return
    assert got_err is None, got_err
    pages = sum(-(-e // cfg.page_size) for e in Es)
    if len(L0s) <= MAX_REQUESTS and (cfg.cp_strategy == "zigzag" or pages <= 512):
        assert probe is not None  # the call really took the page-aligned path (interleave: <= 512 new pages)
        event("page-aligned path")
    assert got.out_cache_loc.dtype == torch.int64 and torch.equal(got.out_cache_loc, want.out_cache_loc)
    assert got.new_pages.tolist() == want.new_pages.tolist() and not got.new_pages.flags.writeable
    assert snapshot(alloc) == snapshot(general)
    assert_same_plan(got.plan, want.plan)


def test_sglang_shapes_take_the_path_and_give_the_general_paths_pages():
    # C=8, P=64, fresh balanced pool (lane 0 lacks page 0): one 64-token prompt goes to lane 1 (page 9 of
    # the shared layout is lane 1's local page 1), slots 576..639; then 8 prompts of 1,024 tokens (16 pages
    # each, two per lane) and one of 8,192 tokens (128 pages, 16 per lane), each against the general path.
    C, P = 8, 64
    alloc = OwnerLaneAllocator(CPConfig(C, P, "balanced"), 64)
    for B, E in ((1, 64), (8, 1024), (1, 8192), (3, 100)):
        args = (np.zeros(B, np.int64), np.full(B, E, np.int64), np.full(B, -1, np.int64))
        general = copy.deepcopy(alloc)
        assert pick_aligned(copy.deepcopy(alloc).pool, alloc.config, *args) is not None
        got, want = alloc.alloc_extend(*args), general._alloc_planned(*args)
        assert got.out_cache_loc_cpu.tolist() == want.out_cache_loc_cpu.tolist()
        assert got.new_pages.tolist() == want.new_pages.tolist()
        assert snapshot(alloc) == snapshot(general)
        assert_same_plan(got.plan, want.plan)
        if B == 1 and E == 64:
            assert got.new_pages.tolist() == [1] and got.out_cache_loc_cpu[[0, -1]].tolist() == [64, 127]
        if E == 1024:
            assert np.bincount(got.new_pages % C, minlength=C).tolist() == [16] * C


def test_path_declines_what_it_does_not_take():
    alloc = OwnerLaneAllocator(CPConfig(4, 4, "balanced"), 8)
    pool, cfg = alloc.pool, alloc.config
    held = int(alloc.alloc_extend([0], [4], [-1]).new_pages[0])
    assert (
        pick_aligned(pool, cfg, [0] * (MAX_REQUESTS + 1), [4] * (MAX_REQUESTS + 1), [-1] * (MAX_REQUESTS + 1))
        is None
    )
    assert pick_aligned(pool, cfg, [2], [4], [held * 4 + 1]) is None  # prefix off a page boundary (a head)
    assert pick_aligned(pool, cfg, np.zeros((1, 1), np.int64), [4], [-1]) is None  # not 1-D
    assert pick_aligned(pool, cfg, [0], [4.0], [-1]) is None  # not integers
    assert pick_aligned(pool, cfg, [0], [4 * 40], [-1]) is None  # a lane is short: the general path raises
    assert pick_aligned(pool, cfg, [4], [4], [held * 4 + 3]) is not None  # a continued chain
