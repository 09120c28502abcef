"""Worked examples of the prefix cache and its host tier (SPEC section 8, C-RELOAD).

Each test builds a small owner-lane pool, runs requests through the cache the way an engine does
(match, lock, allocate the extend, insert, unlock, free the partial last page) and checks exact values,
with the arithmetic in comments.
"""

import numpy as np
import pytest

from cpkv import ConfigError, CPConfig, LaneExhausted, OwnerLaneAllocator
from cpkv.cache import PrefixCache
from cpkv.errors import PrefixCacheError

pytestmark = pytest.mark.unit


def make(cp_size=4, page_size=16, pages_per_lane=64, host=0, **kw):
    alloc = OwnerLaneAllocator(
        CPConfig(cp_size=cp_size, page_size=page_size, owner_policy="rotation"), pages_per_lane
    )
    return alloc, PrefixCache(alloc, host_pages_per_lane=host, **kw)


def run_request(alloc, cache, tokens, req_index=0):
    """One request start to finish: returns (slots it used, the page owners its plan chose)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    m = cache.match_prefix(tokens[:-1])
    m = cache.load_back(m)
    cache.lock(m.handle)
    # req_index is emulated with a batch of empty requests ahead of this one (C-PHASE rotates by index).
    ext = alloc.alloc_extend(
        [0] * req_index + [m.device_len],
        [0] * req_index + [len(tokens) - m.device_len],
        [-1] * req_index + [m.last_loc],
    )
    slots = np.concatenate([m.device_slots, ext.out_cache_loc.numpy()])
    res = cache.insert(tokens, slots)
    slots[: res.slots.shape[0]] = res.slots
    cache.unlock(m.handle)
    tail = slots[res.slots.shape[0] :]
    if tail.size:
        alloc.free([int(tail[0]) // alloc.config.page_size])  # the caller keeps and frees the partial page
    return slots, ext.plan.page_owners


@pytest.mark.clause("C-RELOAD")
def test_match_is_page_aligned_and_never_past_the_shared_prefix():
    # A = 150 X + 400 Y, B = 150 X + 400 Z with Y[0] != Z[0]: they share exactly 150 tokens.
    # P = 16: 150 // 16 = 9 whole pages = 144 tokens; the 10th page (tokens 144..159) differs at 150.
    alloc, cache = make()
    X = np.arange(1, 151)
    Y, Z = np.arange(1000, 1400), np.arange(5000, 5400)
    A, B = np.concatenate([X, Y]), np.concatenate([X, Z])
    slots_a, _ = run_request(alloc, cache, A)
    m = cache.match_prefix(B)
    assert m.prefix_len == m.device_len == 144
    assert m.host_len == 0
    assert m.device_slots.tolist() == slots_a[:144].tolist()
    assert m.last_loc == int(slots_a[143])
    # A itself: 550 tokens = 34 whole pages (544) + 6 tokens of a page that is never shared.
    assert cache.match_prefix(A).prefix_len == 544
    assert cache.total_cached_pages == 34


@pytest.mark.clause("C-RELOAD")
def test_partial_last_page_is_never_shared():
    # 40 tokens, P=16: pages hold tokens 0..15, 16..31 and (partly) 32..39; only two pages enter the tree.
    alloc, cache = make(cp_size=2, page_size=16, pages_per_lane=8)
    tokens = np.arange(7, 47)
    ext = alloc.alloc_extend([0], [40], [-1])
    res = cache.insert(tokens, ext.out_cache_loc)
    assert res.pages.shape == (2,)
    assert res.new_pages == 2
    assert cache.match_prefix(np.concatenate([tokens, [99] * 30])).prefix_len == 32
    # The caller still holds the third page: it is not free and not cached.
    third = int(ext.out_cache_loc[32]) // 16
    assert not alloc.is_free([third])[0]
    assert third not in res.pages.tolist()


@pytest.mark.clause("C-RELOAD")
def test_duplicate_pages_are_freed_and_the_tree_pages_returned():
    # Two requests prefill the same 64 tokens (P=16: 4 pages) into their own pages; the second insert
    # finds all 4 pages cached, frees its own 4 and returns the first request's slots.
    alloc, cache = make(cp_size=2, page_size=16, pages_per_lane=16)
    tokens = np.arange(100, 164)
    first = alloc.alloc_extend([0], [64], [-1]).out_cache_loc
    second = alloc.alloc_extend([0], [64], [-1]).out_cache_loc
    free_before = alloc.total_free_pages
    r1 = cache.insert(tokens, first)
    r2 = cache.insert(tokens, second)
    assert r1.new_pages == 4 and r2.new_pages == 0
    assert r2.slots.tolist() == first.tolist()
    assert sorted(r2.duplicate_pages.tolist()) == sorted(set((second // 16).tolist()))
    assert alloc.total_free_pages == free_before + 4
    assert alloc.is_free(r2.duplicate_pages).all()
    c = cache.counters()
    assert (c["inserted_pages"], c["duplicate_pages"]) == (4, 4)


@pytest.mark.clause("C-RELOAD")
def test_evict_frees_lru_pages_of_the_lane_and_counts_collateral():
    # C=2, P=4, one request of 16 tokens = 4 pages, phase 0: m=4, 2C=4 segments of one page, owners
    # z(s) = 0,1,1,0 -> lanes [0, 1, 1, 0]. Evicting one lane-0 page takes the deepest lane-0 page (page
    # index 3, a leaf): no collateral. Evicting one more lane-0 page can only take page index 0, whose
    # device descendants (indices 1, 2 on lane 1) go with it: 2 collateral pages on lane 1.
    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=8)
    tokens = np.arange(1, 17)
    _, owners = run_request(alloc, cache, tokens)
    assert owners.tolist() == [0, 1, 1, 0]
    assert cache.cached_pages_per_lane().tolist() == [2, 2]
    free0 = alloc.free_pages_per_lane()
    assert cache.evict(0, 1) == 1
    assert cache.match_prefix(tokens).prefix_len == 12
    assert (alloc.free_pages_per_lane() - free0).tolist() == [1, 0]
    assert cache.evict(0, 1) == 1
    assert cache.match_prefix(tokens).prefix_len == 0
    assert (alloc.free_pages_per_lane() - free0).tolist() == [2, 2]
    c = cache.counters()
    assert c["evicted_pages"] == [2, 2]
    assert c["evicted_collateral_pages"] == [0, 2]
    assert cache.evict(0, 5) == 0  # nothing left


@pytest.mark.clause("C-RELOAD")
def test_locked_pages_are_never_evicted():
    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=8)
    tokens = np.arange(1, 17)
    run_request(alloc, cache, tokens)
    m = cache.match_prefix(tokens)
    cache.lock(m.handle)
    assert cache.evictable_pages_per_lane().tolist() == [0, 0]
    assert cache.evict(0, 4) == 0 and cache.evict(1, 4) == 0
    assert cache.match_prefix(tokens).device_pages.tolist() == m.device_pages.tolist()
    cache.unlock(m.handle)
    assert cache.evictable_pages_per_lane().tolist() == [2, 2]
    with pytest.raises(PrefixCacheError, match="unlock without lock"):
        cache.unlock(m.handle)


@pytest.mark.clause("C-RELOAD")
def test_evicted_pages_load_back_on_their_recorded_lanes():
    # Three requests in one rotation sequence (req_index 0, 1, 2) put their pages on different lanes.
    # Everything is evicted to the host tier, other allocations move the free lists, and load-back must
    # still place every page on the lane recorded at eviction, restoring the payload backed up for it.
    restored = {}
    alloc, cache = make(
        cp_size=4,
        page_size=8,
        pages_per_lane=32,
        host=32,
        backup_fn=lambda p: ("kv", p),
        restore_fn=lambda p, payload: restored.update({p: payload}),
    )
    prompts = [np.arange(1, 100) + 1000 * i for i in range(3)]
    lanes, old_pages = [], []
    for i, tokens in enumerate(prompts):
        slots, owners = run_request(alloc, cache, tokens, req_index=i)
        n = len(tokens) // 8  # 99 tokens: 12 whole pages
        lanes.append(owners[:n].tolist())
        old_pages.append((slots[: n * 8 : 8] // 8).tolist())
        assert [p % 4 for p in old_pages[-1]] == lanes[-1]
    assert lanes[0] != lanes[1]  # the rotation put them elsewhere
    for r in range(4):
        cache.evict(r, 100)
    assert cache.total_cached_pages == 0
    assert cache.counters()["backups"] == 36
    junk = alloc.alloc_pages([0, 1, 2, 3, 3, 2])  # perturb which page ids are free
    for tokens, rec, old in zip(prompts, lanes, old_pages, strict=True):
        m = cache.match_prefix(tokens)
        assert m.device_len == 0 and m.host_lanes.tolist() == rec
        back = cache.load_back(m)
        assert back.device_len == 96 and back.host_len == 0
        assert (back.device_pages % 4).tolist() == rec
        assert not set(back.device_pages.tolist()) & set(junk.tolist())
        # Each new page received the payload backed up from the old page at the same position.
        assert [restored[p] for p in back.device_pages.tolist()] == [("kv", p) for p in old]
    assert len(restored) == 36
    assert cache.counters()["load_backs"] == 36


@pytest.mark.clause("C-RELOAD")
def test_reload_on_a_fresh_device_pool_keeps_recorded_lanes():
    # After offloading everything the device pool is as fresh as a new one (every usable page free);
    # reloading (in reverse order, so page ids differ) puts each page back on its recorded lane.
    alloc, cache = make(cp_size=4, page_size=4, pages_per_lane=16, host=16)
    prompts = [np.arange(1, 30) + 100 * i for i in range(4)]
    recorded = {}
    for i, tokens in enumerate(prompts):
        slots, _ = run_request(alloc, cache, tokens, req_index=i)
        recorded[i] = (slots[:28:4] // 4 % 4).tolist()
    for r in range(4):
        cache.evict(r, 1000)
    assert alloc.free_pages_per_lane().tolist() == alloc.capacity_per_lane.tolist()
    for i in reversed(range(4)):
        back = cache.load_back(cache.match_prefix(prompts[i]))
        assert (back.device_pages % 4).tolist() == recorded[i]
    assert {e.lane for e in cache.entries() if e.page >= 0} == {0, 1, 2, 3}
    assert all(e.page % 4 == e.lane for e in cache.entries() if e.page >= 0)


@pytest.mark.clause("C-RELOAD")
def test_lane_full_of_locked_pages_makes_load_back_recompute():
    # C=2, P=4, Q=6 per lane (lane 0: 5 usable pages, lane 1: 6). Request R: 16 tokens, owners
    # [0, 1, 1, 0] (see the eviction example). After R is offloaded, lane 0 is filled: a second request S
    # whose pages are locked in the tree, and the remaining lane-0 pages held by a running request.
    # Load-back of R needs lane 0 for its first page: the lane has nothing evictable, so load-back gives up
    # at once with a usable prefix of 0 pages and counts one capacity failure; the request recomputes.
    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=6, host=8)
    r_tokens = np.arange(1, 17)
    run_request(alloc, cache, r_tokens)
    cache.evict(0, 10)
    assert cache.total_cached_pages == 0
    # S: 9 tokens = 3 pages, 2C=4 segments of sizes 1,1,1,0 -> owners [0, 1, 1]; 2 whole pages cached.
    s_tokens = np.arange(50, 59)
    _, s_owners = run_request(alloc, cache, s_tokens)
    assert s_owners.tolist() == [0, 1, 1]
    s = cache.match_prefix(s_tokens)
    cache.lock(s.handle)
    held = alloc.alloc_pages([0] * int(alloc.free_pages_per_lane()[0]))
    assert alloc.free_pages_per_lane()[0] == 0
    m = cache.match_prefix(r_tokens)
    assert m.host_lanes.tolist() == [0, 1, 1, 0]
    back = cache.load_back(m)
    assert back.device_len == 0 and back.host_len == 0
    c = cache.counters()
    assert c["load_back_owner_lane_capacity_failed"] == 1
    assert c["load_back_failed_pages"] == 4
    assert c["load_backs"] == 0
    # The locked pages survived, and lane 0 raises at once (nothing waits).
    assert cache.match_prefix(s_tokens).device_pages.tolist() == s.device_pages.tolist()
    with pytest.raises(LaneExhausted):
        alloc.alloc_pages([0])
    # Once the running request frees lane 0, a new load-back succeeds on the recorded lanes.
    alloc.free(held)
    back = cache.load_back(cache.match_prefix(r_tokens))
    assert (back.device_pages % 2).tolist() == [0, 1, 1, 0]


@pytest.mark.clause("C-RELOAD")
def test_load_back_evicts_on_the_short_lane_then_retries():
    # Lane 0 has no free page but an unlocked cached page: load-back evicts it and succeeds.
    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=6, host=8)
    r_tokens = np.arange(1, 17)  # owners [0, 1, 1, 0]
    run_request(alloc, cache, r_tokens)
    cache.evict(0, 10)  # R -> host
    s_tokens = np.arange(50, 59)
    run_request(alloc, cache, s_tokens)  # S: whole pages on lanes [0, 1], unlocked
    held = alloc.alloc_pages([0] * int(alloc.free_pages_per_lane()[0]) + [1, 1])
    # R needs 2 lane-0 and 2 lane-1 pages; lane 0 has 0 free and 1 evictable page, lane 1 has 6-1-2=3.
    before = cache.counters()
    assert before["evicted_collateral_pages"] == [0, 2]  # R's lane-1 pages went with its first page
    back = cache.load_back(cache.match_prefix(r_tokens))
    # Lane 0 got 1 page back by evicting S's lane-0 page (and S's lane-1 page below it as collateral);
    # R's first page (lane 0) fits, the fourth (the second lane-0 page) does not: usable prefix = 3 pages.
    assert (back.device_pages % 2).tolist() == [0, 1, 1]
    c = cache.counters()
    assert c["load_back_owner_lane_capacity_failed"] == 1 and c["load_back_failed_pages"] == 1
    assert c["evicted_collateral_pages"] == [0, 3]
    assert [x - y for x, y in zip(c["evicted_pages"], before["evicted_pages"], strict=True)] == [1, 1]
    alloc.free(held)


@pytest.mark.clause("C-RELOAD")
def test_load_back_counts_collateral_pages_towards_other_short_lanes():
    # C=2, P=4, Q=6 (lane 0: 5 usable pages, lane 1: 6). R (16 tokens, lanes [0, 1, 1, 0]) is offloaded;
    # S (16 other tokens, same lanes) stays cached and unlocked. Held pages leave lane 0 with 0 free and
    # lane 1 with 1 free, and R needs 2 + 2. Evicting lane 0's shortfall (2) takes S's page 3 (a leaf),
    # then S's page 0 with pages 1, 2 on lane 1 as collateral: lane 1 now has 3 free, no longer short, so
    # it is not evicted on, and all 4 pages of R load back.
    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=6, host=8)
    r_tokens, s_tokens = np.arange(1, 17), np.arange(40, 56)
    run_request(alloc, cache, r_tokens)
    cache.evict(0, 10)
    run_request(alloc, cache, s_tokens)
    held = alloc.alloc_pages([0] * 3 + [1] * 3)
    assert alloc.free_pages_per_lane().tolist() == [0, 1]
    before = cache.counters()
    back = cache.load_back(cache.match_prefix(r_tokens))
    assert (back.device_pages % 2).tolist() == [0, 1, 1, 0]
    after = cache.counters()
    assert [a - b for a, b in zip(after["evicted_pages"], before["evicted_pages"], strict=True)] == [2, 2]
    assert after["load_back_owner_lane_capacity_failed"] == 0
    s = cache.match_prefix(s_tokens)  # S went to the host tier
    assert (s.device_len, s.host_len) == (0, 16)
    alloc.free(held)


@pytest.mark.clause("C-RELOAD")
def test_eviction_takes_the_deepest_page_of_the_least_recent_prefix():
    # C=1, P=2, 8 tokens = 4 pages [a, b, c, d]. Evicting 2 takes d then c (deepest first) to the host.
    # After load-back the whole path is recently used, root side newest: evicting 1 takes d again
    # (not a, which would take b, c, d with it).
    alloc, cache = make(cp_size=1, page_size=2, pages_per_lane=16, host=4)
    tokens = np.arange(1, 9)
    run_request(alloc, cache, tokens)
    assert cache.evict(0, 2) == 2
    assert (cache.match_prefix(tokens).device_len, cache.match_prefix(tokens).host_len) == (4, 4)
    assert cache.load_back(cache.match_prefix(tokens)).device_len == 8
    assert cache.evict(0, 1) == 1
    assert cache.match_prefix(tokens).device_len == 6


@pytest.mark.clause("C-RELOAD")
def test_host_tier_is_bounded_and_lru_per_lane():
    # C=1, P=2, host capacity 2. Prompt A (9 tokens: 4 whole pages a0..a3) evicted in one call is written
    # back ancestors first: a0 and a1 fill the shard; a2 finds no room (the shard only holds copies of
    # pages this call evicts), so a2 and a3 are dropped without being copied. (The per-page tree of
    # cpkv 0.1 wrote a3 and a2 first and then dropped them for a1 and a0: 4 backups, 2 host evictions.)
    alloc, cache = make(cp_size=1, page_size=2, pages_per_lane=16, host=2)
    a_tokens = np.arange(1, 10)
    run_request(alloc, cache, a_tokens)
    assert cache.evict(0, 4) == 4
    c = cache.counters()
    assert (c["backups"], c["host_evictions"], c["host_dropped"]) == (2, 0, 0)
    assert cache.host_copies_per_lane().tolist() == [2]
    m = cache.match_prefix(a_tokens)  # touches a1, then a0: a0 is the most recently used copy
    assert (m.device_len, m.host_len) == (0, 4)
    # Prompt B (5 tokens: b0, b1) evicted next: b0 drops the LRU copy a1; b1 drops a0, and with it the
    # whole host-only prompt A.
    b_tokens = np.arange(50, 55)
    run_request(alloc, cache, b_tokens)
    assert cache.evict(0, 2) == 2
    c = cache.counters()
    assert (c["backups"], c["host_evictions"], c["host_dropped"]) == (4, 2, 0)
    assert cache.match_prefix(a_tokens).prefix_len == 0
    m = cache.match_prefix(b_tokens)
    assert (m.device_len, m.host_len) == (0, 4)


def test_insert_rejects_bad_slots_and_changes_nothing():
    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=8)
    ext = alloc.alloc_extend([0], [8], [-1]).out_cache_loc.numpy()
    tokens = np.arange(1, 9)
    bad = ext.copy()
    bad[5] = bad[4]  # second page's slots not consecutive
    with pytest.raises(PrefixCacheError, match="not one whole page"):
        cache.insert(tokens, bad)
    with pytest.raises(PrefixCacheError, match="entries but token_ids has 8"):
        cache.insert(tokens, ext[:7])
    free_page = int(np.flatnonzero(alloc.is_free(np.arange(alloc.num_pages)))[0])
    with pytest.raises(PrefixCacheError, match=f"page {free_page} is free"):
        cache.insert(tokens[:4], np.arange(4) + 4 * free_page)
    with pytest.raises(PrefixCacheError, match="page 0 cannot be cached"):
        cache.insert(tokens[:4], np.arange(4))
    assert cache.total_cached_pages == 0
    cache.insert(tokens, ext)
    with pytest.raises(PrefixCacheError, match="already cached at another position"):
        cache.insert(np.arange(50, 58), ext)
    assert cache.total_cached_pages == 2


def test_bad_calls_raise_typed_errors():
    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=8, host=4)
    with pytest.raises(PrefixCacheError, match=r"lane=2 out of range \[0, 2\)"):
        cache.evict(2, 1)
    with pytest.raises(PrefixCacheError, match="num_pages=-1 must be an integer >= 0"):
        cache.evict(0, -1)
    with pytest.raises(ConfigError, match="host_pages_per_lane must be >= 0"):
        PrefixCache(alloc, host_pages_per_lane=-1)
    with pytest.raises(PrefixCacheError, match="must be an OwnerLaneAllocator"):
        PrefixCache(object())
    with pytest.raises(PrefixCacheError, match="token_ids must hold integers"):
        cache.match_prefix(np.array([1.5, 2.5]))
    tokens = np.arange(1, 17)
    run_request(alloc, cache, tokens)
    cache.evict(0, 10)
    m = cache.match_prefix(tokens)
    run_request(alloc, cache, np.arange(40, 50))  # changes the tree: m is stale now
    with pytest.raises(PrefixCacheError, match="stale"):
        cache.load_back(m)
    other = make(cp_size=2, page_size=4, pages_per_lane=8)[1]
    with pytest.raises(PrefixCacheError, match="another PrefixCache"):
        other.lock(cache.match_prefix(np.arange(40, 50)).handle)


def test_insert_rejects_a_page_beyond_its_lane_capacity():
    # Unequal lanes: lane 0 holds 4 pages (ids 0, 2, 4, 6), lane 1 holds 2 (ids 1, 3); page 5 would be
    # lane 1's third page, which does not exist, although its id is below C * max(Q) = 8.
    alloc = OwnerLaneAllocator(CPConfig(cp_size=2, page_size=2, owner_policy="rotation"), [4, 2])
    cache = PrefixCache(alloc)
    with pytest.raises(PrefixCacheError, match="page 5 does not exist: lane 1 holds 2 pages"):
        cache.insert([1, 2], [10, 11])


def test_counters_start_at_zero_with_every_key():
    c = make(cp_size=3)[1].counters()
    assert c == {
        "hits": 0,
        "misses": 0,
        "matched_tokens": 0,
        "host_matched_tokens": 0,
        "inserted_pages": 0,
        "duplicate_pages": 0,
        "backups": 0,
        "host_evictions": 0,
        "host_dropped": 0,
        "load_backs": 0,
        "load_back_owner_lane_capacity_failed": 0,
        "load_back_failed_pages": 0,
        "evicted_pages": [0, 0, 0],
        "evicted_collateral_pages": [0, 0, 0],
    }


@pytest.mark.clause("C-RELOAD")
def test_failing_callbacks_leak_no_page():
    # restore_fn fails on the second page: the first stays loaded, the other three allocated pages go
    # back to the allocator, and the counters still add up (cached = inserted + load_backs - evicted).
    calls = []

    def restore(page, payload):
        calls.append(page)
        if len(calls) == 2:
            raise RuntimeError("copy failed")

    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=8, host=8, restore_fn=restore)
    tokens = np.arange(1, 17)
    run_request(alloc, cache, tokens)
    cache.evict(0, 10)
    free = alloc.total_free_pages
    with pytest.raises(RuntimeError, match="copy failed"):
        cache.load_back(cache.match_prefix(tokens))
    assert alloc.total_free_pages == free - 1
    m = cache.match_prefix(tokens)
    assert (m.device_len, m.host_len) == (4, 12)
    c = cache.counters()
    assert cache.total_cached_pages == c["inserted_pages"] + c["load_backs"] - sum(c["evicted_pages"]) == 1

    # backup_fn fails: the page it was backing up stays cached on device; nothing is freed twice.
    def backup(page):
        raise RuntimeError("no host memory")

    alloc, cache = make(cp_size=2, page_size=4, pages_per_lane=8, host=8, backup_fn=backup)
    run_request(alloc, cache, tokens)
    free = alloc.total_free_pages
    with pytest.raises(RuntimeError, match="no host memory"):
        cache.evict(0, 1)
    assert alloc.total_free_pages == free
    assert cache.match_prefix(tokens).device_len == 16
