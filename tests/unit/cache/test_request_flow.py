"""One request's KV through the allocator and the prefix cache (``cache/flow.py``, C-RELOAD, C-LOCK): the
engine flow both the simulator and the executor use; every page is accounted for at every step."""

import numpy as np
import pytest

from cpkv import CPConfig, OwnerLaneAllocator
from cpkv.cache import PrefixCache
from cpkv.cache.flow import RequestFlow, request_part

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-RELOAD", "C-LOCK")]


def _group(C=2, P=4, Q=16, cache=True):
    alloc = OwnerLaneAllocator(CPConfig(C, P, "rotation"), Q)
    return alloc, RequestFlow(alloc, PrefixCache(alloc) if cache else None)


def _prefill(flow, kv, start, end):
    a = flow.allocator.alloc_extend([start], [end - start], [kv.last_loc])
    assert kv.take(a, 0) == end - start
    return a


def _accounted(alloc, flow, live):
    """Pages in use = the tree's + those the live requests hold on their own."""
    return int(alloc.used_pages_per_lane().sum()) == int(flow.cache.cached_pages_per_lane().sum()) + sum(
        kv.num_own_pages for kv in live
    )


def test_finish_hands_full_pages_to_the_tree_and_frees_the_partial_page():
    alloc, flow = _group()
    tokens = np.arange(10, dtype=np.int64)  # 2 full pages + 2 tokens
    kv = flow.start(tokens[:-1], 10)
    assert kv.length == 0 and kv.last_loc == -1
    _prefill(flow, kv, 0, 10)
    assert kv.num_own_pages == 3 and _accounted(alloc, flow, [kv])
    kv.finish(tokens)
    assert flow.cache.cached_pages_per_lane().sum() == 2 and alloc.used_pages_per_lane().sum() == 2
    second = flow.start(tokens[:-1], 12)  # the same prompt again: its two full pages hit
    assert second.length == 8 and second.row.tolist() == kv.row[:8].tolist()
    second.release()  # unlocked, nothing of its own
    assert flow.cache.evictable_pages_per_lane().sum() == 2


def test_share_holds_the_prefix_through_the_new_lock_and_drops_duplicates():
    alloc, flow = _group()
    tokens = np.arange(8, dtype=np.int64)
    a, b = flow.start(tokens[:-1], 8), flow.start(tokens[:-1], 8)  # both miss, both compute the same pages
    _prefill(flow, a, 0, 8)
    _prefill(flow, b, 0, 8)
    a.share(tokens)
    assert (
        a.cached == 8 and a.num_own_pages == 0 and flow.cache.evictable_pages_per_lane().sum() == 0
    )  # locked
    b.share(tokens)  # its two pages duplicate a's: freed by the cache, b's row switches to the tree's slots
    assert b.row.tolist() == a.row.tolist() and b.num_own_pages == 0
    assert alloc.used_pages_per_lane().sum() == 2 and _accounted(alloc, flow, [a, b])
    a.release()
    b.release()
    assert flow.cache.evictable_pages_per_lane().sum() == 2


def test_release_frees_every_own_page_and_keeps_the_cached_prefix():
    alloc, flow = _group(P=2)
    tokens = np.arange(6, dtype=np.int64)
    first = flow.start(tokens[:-1], 6)
    _prefill(flow, first, 0, 6)
    first.finish(tokens)  # 3 pages cached
    kv = flow.start(np.arange(9, dtype=np.int64)[:-1], 12)  # same first 6 tokens, then its own
    assert kv.length == 6
    _prefill(flow, kv, 6, 9)
    d = alloc.alloc_decode([9], [kv.last_loc])  # a decode token into the partly filled page
    assert kv.take(d, 0) == 1
    assert kv.length == 10 and kv.num_own_pages == 2
    kv.release()  # a retraction: its own pages go back, the cached prefix stays (unlocked)
    assert alloc.used_pages_per_lane().sum() == 3 and flow.cache.evictable_pages_per_lane().sum() == 3


def test_without_a_cache_a_request_frees_all_its_pages_and_its_row_grows_past_the_capacity():
    alloc, flow = _group(cache=False)
    kv = flow.start(np.arange(5, dtype=np.int64), 5)
    a = _prefill(flow, kv, 0, 6)  # one more slot than the capacity given at start: the row grows
    assert kv.row.tolist() == a.out_cache_loc_cpu.tolist()
    kv.share(np.arange(6))  # no cache: nothing to share
    kv.finish(np.arange(6))
    assert alloc.used_pages_per_lane().sum() == 0


def test_take_appends_request_i_of_a_batch_and_a_kept_prefix_of_it():
    """``take(allocation, i)`` cuts request i's slots and new pages by the plan's indptrs (``request_part``);
    ``tokens`` / ``pages`` keep a prefix of them (what MTP verification keeps)."""
    alloc, flow = _group(C=2, P=2, Q=16, cache=False)
    kvs = [flow.start(np.zeros(0, np.int64), 8) for _ in range(3)]
    a = alloc.alloc_extend([0, 0, 0], [3, 1, 4], [-1, -1, -1])
    out, pages = a.out_cache_loc_cpu, a.new_pages
    assert [p.shape[0] for p in (request_part(a, i)[1] for i in range(3))] == [2, 1, 2]
    assert kvs[0].take(a, 0) == 3 and kvs[1].take(a, 1) == 1
    assert kvs[0].row.tolist() == out[:3].tolist() and kvs[1].row.tolist() == out[3:4].tolist()
    assert kvs[0].own_pages[0].tolist() == pages[:2].tolist() and kvs[1].own_pages[0].tolist() == [pages[2]]
    assert kvs[2].take(a, 2, 1, 1, host_slots=out) == 1  # the first slot and page of its 4 and 2
    assert kvs[2].row.tolist() == [out[4]] and kvs[2].num_own_pages == 1
    assert kvs[2].own_pages[0].tolist() == [pages[3]]
