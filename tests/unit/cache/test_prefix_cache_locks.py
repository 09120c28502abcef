"""Per-handle lock counts of the prefix cache (SPEC section 8, C-LOCK): worked examples.

Each misuse must raise PrefixCacheError and change nothing; ``snapshot`` captures everything observable
(every cached page with its lock count, counters, per-lane queries, host copies, allocator free lists).
"""

import numpy as np
import pytest

from cpkv import CPConfig, OwnerLaneAllocator, PrefixCacheError
from cpkv.cache import PrefixCache

pytestmark = pytest.mark.unit


def make(cp_size=2, page_size=4, pages_per_lane=8, host=0):
    alloc = OwnerLaneAllocator(CPConfig(cp_size, page_size, owner_policy="rotation"), pages_per_lane)
    return alloc, PrefixCache(alloc, host_pages_per_lane=host)


def snapshot(alloc, cache):
    return (
        list(cache.entries()),
        cache.counters(),
        cache.evictable_pages_per_lane().tolist(),
        cache.cached_pages_per_lane().tolist(),
        list(cache.host.items()),
        alloc.state_digest(),
    )


def two_pages():
    """C=2, P=4, Q=8, one 8-token prompt cached as pages A then B, nothing locked: m=2 pages in 2C=4
    segments of sizes 1, 1, 0, 0 give owners z(0)=0, z(1)=1, so A is on lane 0 and B on lane 1."""
    alloc, cache = make()
    tokens = np.arange(1, 9)
    res = insert_prompt(alloc, cache, tokens)
    page_a, page_b = res.pages.tolist()
    assert (page_a % 2, page_b % 2) == (0, 1)
    return alloc, cache, tokens, res, page_a, page_b


def insert_prompt(alloc, cache, tokens):
    """Prefill ``tokens`` into fresh pages and hand them to the cache (nothing locked afterwards)."""
    ext = alloc.alloc_extend([0], [len(tokens)], [-1])
    res = cache.insert(tokens, ext.out_cache_loc)
    tail = ext.out_cache_loc.numpy()[res.slots.shape[0] :]
    if tail.size:
        alloc.free([int(tail[0]) // alloc.config.page_size])
    return res


@pytest.mark.clause("C-LOCK")
def test_spec_example_unlock_through_an_ancestor_handle_raises_and_changes_nothing():
    alloc, cache, tokens, res, page_a, page_b = two_pages()  # the SPEC's C=2, P=4, Q=8 example
    handle_b = res.handle  # the 2-page prefix
    handle_a = cache.match_prefix(tokens[:4]).handle  # the 1-page prefix (splits the run [A, B])
    cache.lock(handle_b)
    before = snapshot(alloc, cache)
    with pytest.raises(PrefixCacheError, match="unlock without lock"):
        cache.unlock(handle_a)
    assert snapshot(alloc, cache) == before
    assert [e.lock_ref for e in cache.entries()] == [1, 1]  # B's lock protects A, its ancestor
    assert cache.evict(0, 100) == 0 and cache.evict(1, 100) == 0  # frees neither A nor B
    assert cache.match_prefix(tokens).device_pages.tolist() == [page_a, page_b]
    cache.unlock(handle_b)
    assert cache.evictable_pages_per_lane().tolist() == [1, 1]  # both evictable now
    assert [e.lock_ref for e in cache.entries()] == [0, 0]
    # Evicting A's lane takes A, and B (its child) with it as collateral.
    assert cache.evict(0, 100) == 1
    assert cache.counters()["evicted_pages"] == [1, 1]
    assert alloc.is_free([page_a, page_b]).all()


@pytest.mark.clause("C-LOCK")
def test_no_count_goes_negative_and_a_later_lock_protects():
    # lock(B), unlock(A) (refused), unlock(B): every count is back at 0, never -1; a later lock(A)
    # protects A but not B, which is below it.
    alloc, cache, tokens, res, page_a, page_b = two_pages()
    handle_a = cache.match_prefix(tokens[:4], record=False).handle  # inside the run [A, B]: no split
    cache.lock(res.handle)
    with pytest.raises(PrefixCacheError, match="unlock without lock"):
        cache.unlock(handle_a)
    cache.unlock(res.handle)
    assert [e.lock_ref for e in cache.entries()] == [0, 0]
    with pytest.raises(PrefixCacheError, match="unlock without lock"):
        cache.unlock(res.handle)
    cache.lock(handle_a)  # the handle taken inside the run still means page A
    assert [e.lock_ref for e in cache.entries()] == [1, 0]
    assert cache.evictable_pages_per_lane().tolist() == [0, 1]
    assert cache.evict(0, 100) == 0  # A is locked
    assert cache.evict(1, 100) == 1  # B is not
    assert cache.match_prefix(tokens).device_pages.tolist() == [page_a]
    cache.unlock(handle_a)
    assert cache.evict(0, 100) == 1


@pytest.mark.clause("C-LOCK")
def test_handle_inside_a_run_keeps_its_pages_across_splits():
    # P=2, C=1: prompt X = 8 tokens, one run of 4 pages [p0..p3]. A handle of the first 3 pages is taken
    # inside the run; then the run is split after p0, p1 and p2 (two divergent prompts and a match
    # ending after p1). The handle still names pages p0, p1, p2: locking it protects exactly them.
    alloc, cache = make(cp_size=1, page_size=2, pages_per_lane=16)
    x = np.arange(1, 9)
    pages = insert_prompt(alloc, cache, x).pages.tolist()
    h = cache.match_prefix(x[:6], record=False).handle
    insert_prompt(alloc, cache, np.concatenate([x[:2], [50, 51, 52]]))  # diverges after p0: split there
    cache.match_prefix(x[:4])  # a stamp that ends after p1: split there
    insert_prompt(alloc, cache, np.concatenate([x[:6], [60, 61]]))  # diverges after p2: split there
    assert cache.tree.num_nodes >= 4  # the run was split
    cache.lock(h)
    locked = sorted(e.page for e in cache.entries() if e.lock_ref)
    assert locked == sorted(pages[:3])
    cache.evict(0, 100)
    assert cache.match_prefix(x).device_pages.tolist() == pages[:3]
    cache.unlock(h)
    assert cache.evict(0, 100) == 3
    assert cache.total_cached_pages == 0


@pytest.mark.clause("C-LOCK")
def test_stale_handles_raise_even_after_the_prefix_is_loaded_back():
    # C=1, P=2, host tier: a handle of prompt X's 2 pages, X evicted to the host and loaded back on
    # other pages. The old handle named the evicted pages: lock raises; the new handle works.
    alloc, cache = make(cp_size=1, page_size=2, pages_per_lane=16, host=8)
    x = np.arange(1, 5)
    res = insert_prompt(alloc, cache, x)
    assert cache.evict(0, 10) == 2
    before = snapshot(alloc, cache)
    with pytest.raises(PrefixCacheError, match="stale handle"):
        cache.lock(res.handle)
    with pytest.raises(PrefixCacheError, match="stale handle"):
        cache.unlock(res.handle)
    assert snapshot(alloc, cache) == before
    back = cache.load_back(cache.match_prefix(x))
    assert back.device_len == 4
    with pytest.raises(PrefixCacheError, match="stale handle"):
        cache.lock(res.handle)
    cache.lock(back.handle)
    cache.unlock(back.handle)


@pytest.mark.clause("C-LOCK")
def test_every_misuse_is_a_typed_error_never_a_bare_key_or_index_error():
    alloc, cache = make()
    other = make()[1]
    tokens = np.arange(1, 9)
    res = insert_prompt(alloc, cache, tokens)
    before = snapshot(alloc, cache)
    for bad in (None, 42, "handle", object(), other.match_prefix(tokens).handle):
        for call in (cache.lock, cache.unlock):
            with pytest.raises(PrefixCacheError):
                call(bad)
    with pytest.raises(PrefixCacheError):
        cache.load_back("not a match")
    with pytest.raises(PrefixCacheError):
        cache.unlock(cache.match_prefix(tokens).handle)  # never locked
    with pytest.raises(PrefixCacheError):
        cache.unlock(cache.match_prefix([]).handle)  # the root's handle, never locked
    assert [tuple(e)[:3] for e in cache.entries()] == [tuple(e)[:3] for e in before[0]]
    assert cache.evictable_pages_per_lane().tolist() == before[2]
    assert res.pages.shape == (2,)


@pytest.mark.clause("C-LOCK")
def test_locks_nest_per_handle_and_equal_handles_are_one_handle():
    # Two matches of the same prefix give handles of the same prefix: a lock through one can be released
    # through the other. Locks nest: two locks need two unlocks.
    alloc, cache = make()
    tokens = np.arange(1, 9)
    insert_prompt(alloc, cache, tokens)
    h1, h2 = cache.match_prefix(tokens).handle, cache.match_prefix(tokens, record=False).handle
    cache.lock(h1)
    cache.lock(h1)
    cache.unlock(h2)
    assert cache.evictable_pages_per_lane().tolist() == [0, 0]
    cache.unlock(h1)
    assert cache.evictable_pages_per_lane().tolist() == [1, 1]
    with pytest.raises(PrefixCacheError, match="unlock without lock"):
        cache.unlock(h2)
