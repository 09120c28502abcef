"""The slot checks of ``PrefixCache.insert`` (``PageChecker.whole_pages``) against a page-by-page reference.

``whole_pages`` checks all pages at once in reused buffers; the reference below states the same rules one
page at a time, in the documented order (whole pages, range, existence on its lane, held, listed once).
Both must return the same pages or raise the same ``PrefixCacheError`` message, for valid and broken
slots alike, on equal and unequal lanes, and when the buffers are reused across calls of other sizes.
"""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig, OwnerLaneAllocator, PrefixCacheError
from cpkv.cache import PrefixCache
from cpkv.cache.checks import PageChecker

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-RELOAD")]


def reference_pages(slots: list[int], P: int, alloc: OwnerLaneAllocator) -> list[int]:
    """Page ids of whole pages, one page at a time (plain Python ints), or PrefixCacheError."""
    k = len(slots) // P
    for i in range(k):
        row = slots[i * P : (i + 1) * P]
        p = row[0] // P
        if row != [p * P + j for j in range(P)]:
            raise PrefixCacheError(
                f"slots of page {i} (tokens {i * P}..{i * P + P - 1}) are not one whole page: {row[:8]}..."
            )
    pages = [slots[i * P] // P for i in range(k)]
    for p in pages:
        if not 0 < p < alloc.num_pages:
            raise PrefixCacheError(f"page {p} cannot be cached (page 0 or out of range)")
    C, lane_pages = alloc.config.cp_size, alloc.lane_pages.tolist()
    for p in pages:
        if p // C >= lane_pages[p % C]:
            raise PrefixCacheError(f"page {p} does not exist: lane {p % C} holds {lane_pages[p % C]} pages")
    for p in pages:
        if alloc.is_free([p])[0]:
            raise PrefixCacheError(f"page {p} is free in the allocator: insert only pages you hold")
    twice = sorted({p for p in pages if pages.count(p) > 1})
    if twice:
        raise PrefixCacheError(f"page {twice[0]} is listed more than once")
    return pages


def outcome(fn, *args):
    try:
        return [int(p) for p in fn(*args)]
    except PrefixCacheError as e:
        return str(e)


def assert_matches_reference(case, allocator_rows: bool = False) -> None:
    """Each call's ``whole_pages`` (pages or error text) equals ``reference_pages``'s, buffers reused."""
    alloc, P, calls = case
    checker = PageChecker(alloc)
    for slots in calls:
        k = len(slots) // P
        got = outcome(
            lambda s: checker.whole_pages(s, allocator_rows=allocator_rows),
            np.asarray(slots[: k * P], dtype=np.int64),
        )
        assert got == outcome(reference_pages, slots[: k * P], P, alloc)


@st.composite
def cases(draw, edges_only: bool = False):
    """An allocator and calls of slots: held, free, page 0 and out-of-range pages, with one slot or one
    page's slots broken; ``edges_only``: a broken slot is a page's first or last (what ``allocator_rows``
    checks)."""
    C, P = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    lanes = [draw(st.integers(2, 6)) for _ in range(C)] if draw(st.booleans()) else draw(st.integers(2, 6))
    strategy = draw(st.sampled_from(["zigzag", "interleave"]))
    alloc = OwnerLaneAllocator(
        CPConfig(cp_size=C, page_size=P, owner_policy="rotation", cp_strategy=strategy), lanes
    )
    for lane in draw(st.lists(st.integers(0, C - 1), max_size=8)):
        if alloc.free_pages_per_lane()[lane]:
            alloc.alloc_pages([lane])
    calls = []
    for _ in range(draw(st.integers(1, 3))):  # several calls: the buffers grow and are reused
        pages = draw(
            st.lists(st.integers(-1, alloc.num_pages + 1), max_size=6)
        )  # held, free, 0, out of range
        slots = [p * P + j for p in pages for j in range(P)] + draw(
            st.lists(st.integers(0, 40), max_size=P - 1)
        )
        if slots and draw(st.booleans()):  # break one slot: a shift, another page's slot, or a negative one
            i = draw(st.integers(0, len(slots) - 1))
            if edges_only and len(slots) >= P:
                i = draw(st.integers(0, len(slots) // P - 1)) * P + draw(st.sampled_from([0, P - 1]))
            slots[i] = draw(st.sampled_from([slots[i] + 1, slots[i] - 1, slots[i] + P, -slots[i] - 1]))
        if len(slots) >= P and draw(st.booleans()):  # shift one whole page's slots (consecutive, not aligned)
            i, d = draw(st.integers(0, len(slots) // P - 1)), draw(st.integers(1, 2 * P))
            slots[i * P : (i + 1) * P] = [s + d for s in slots[i * P : (i + 1) * P]]
        calls.append(slots)
    return alloc, P, calls


@settings(max_examples=300, deadline=None)
@given(cases())
def test_whole_pages_matches_the_page_by_page_reference(case):
    assert_matches_reference(case)


@settings(max_examples=300, deadline=None)
@given(cases(edges_only=True))
def test_allocator_rows_check_matches_the_reference_on_page_edges(case):
    # allocator_rows compares each page's first and last slot only: the same pages, and the same error,
    # wherever a page's slots are shifted whole or its first or last slot is off, and for every page check
    assert_matches_reference(case, allocator_rows=True)


def test_whole_pages_example_and_errors():
    # C=2, P=4, 8 pages per lane: one held page on each lane, p on lane 0 and q on lane 1.
    alloc = OwnerLaneAllocator(CPConfig(cp_size=2, page_size=4, owner_policy="rotation"), 8)
    p, q = alloc.alloc_pages([0, 1]).tolist()
    checker = PageChecker(alloc)
    slots = np.asarray([p * 4, p * 4 + 1, p * 4 + 2, p * 4 + 3, q * 4, q * 4 + 1, q * 4 + 2, q * 4 + 3])
    assert checker.whole_pages(slots).tolist() == [p, q]
    shifted = slots + 1  # page p's slots now start at offset 1: not a whole page
    with pytest.raises(PrefixCacheError, match="slots of page 0 .* are not one whole page"):
        checker.whole_pages(shifted)
    with pytest.raises(PrefixCacheError, match=f"page {p} is listed more than once"):
        checker.whole_pages(np.concatenate([slots[:4], slots[:4]]))
    alloc.free([q])
    with pytest.raises(PrefixCacheError, match=f"page {q} is free in the allocator"):
        checker.whole_pages(slots)


def test_insert_names_the_first_page_cached_elsewhere_after_the_trees_own_pages():
    # C=1, P=2: prompt A (6 tokens) caches pages [a, b, c]. Prompt B shares A's first page (its slots are
    # a's, the tree's own page: fine) and then lists c, which the tree holds at A's position 2: B's
    # position 1 (token 2) is named. Nothing changes.
    alloc = OwnerLaneAllocator(CPConfig(cp_size=1, page_size=2, owner_policy="rotation"), 8)
    cache = PrefixCache(alloc)
    a, b, c = alloc.alloc_pages([0, 0, 0]).tolist()
    slots_a = np.asarray([a * 2, a * 2 + 1, b * 2, b * 2 + 1, c * 2, c * 2 + 1])
    assert cache.insert(np.arange(1, 7), slots_a).pages.tolist() == [a, b, c]
    before = list(cache.entries())
    with pytest.raises(
        PrefixCacheError, match=rf"^page {c} \(token 2\) is already cached at another position$"
    ):
        cache.insert(np.asarray([1, 2, 9, 9]), np.asarray([a * 2, a * 2 + 1, c * 2, c * 2 + 1]))
    assert list(cache.entries()) == before


@pytest.mark.parametrize("short", [[1, 2], [1, 2, 3, 4], [0, -1, 0], "abc"])
def test_evict_lanes_refuses_a_bad_short_and_evicts_nothing(short):
    alloc = OwnerLaneAllocator(CPConfig(3, 2, "rotation"), 6)
    cache = PrefixCache(alloc)
    a = alloc.alloc_extend([0], [12], [-1])
    cache.insert(np.arange(1, 13), a.out_cache_loc_cpu)  # 6 unlocked pages, 2 per lane
    before = (alloc.state_digest(), cache.evictable_pages_per_lane().tolist())
    with pytest.raises(PrefixCacheError, match="short"):
        cache.evict_lanes(short)
    assert (alloc.state_digest(), cache.evictable_pages_per_lane().tolist()) == before
    assert before[1] == [2, 2, 2]


@settings(max_examples=60, deadline=None)
@given(C=st.integers(2, 4), seed=st.integers(0, 2**31), data=st.data())
def test_evict_lanes_is_one_evict_per_lane_in_lane_order(C, seed, data):
    # collateral pages (a run's device subtree on other lanes) make lanes' free stacks depend on the order
    # of the pages freed: one free of all lanes must leave them as the per-lane calls do
    rng = np.random.default_rng(seed)
    alloc = OwnerLaneAllocator(CPConfig(C, 2, "rotation"), 40)
    cache = PrefixCache(alloc)
    for _ in range(6):
        stem = rng.integers(1, 4, size=int(rng.integers(2, 8)) * 2)  # shared stems: subtrees across lanes
        tokens = np.concatenate([stem, rng.integers(1, 50, size=int(rng.integers(2, 12)))])
        m = cache.match_prefix(tokens[:-1])
        n = m.device_len
        row = np.empty(tokens.shape[0], dtype=np.int64)
        m.write_device_slots(row)
        a = alloc.alloc_extend([n], [tokens.shape[0] - n], [m.last_loc])
        row[n:] = a.out_cache_loc_cpu
        res = cache.insert(tokens, row)
        tail = row[res.pages.shape[0] * 2 :] // 2
        if tail.shape[0]:
            alloc.free(tail[:1])
        cache.match_prefix(tokens[: int(rng.integers(1, tokens.shape[0]))])  # touch a prefix: LRU order
    twin_alloc, twin = copy.deepcopy((alloc, cache))  # one copy: the twin cache frees into the twin pool
    assert twin.allocator is twin_alloc
    short = data.draw(st.lists(st.integers(0, 5), min_size=C, max_size=C))
    got = cache.evict_lanes(short)
    assert got == [twin.evict(r, n) if n else 0 for r, n in enumerate(short)]
    assert alloc.state_digest() == twin_alloc.state_digest()
