"""One request's KV through the allocator and the prefix cache (``cache/flow.py``, C-RELOAD, C-LOCK): the
engine flow both the simulator and the executor use; every page is accounted for at every step."""

import numpy as np
import pytest

from cpkv import CPConfig, OwnerLaneAllocator
from cpkv.cache import PrefixCache
from cpkv.cache.flow import RequestFlow

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-RELOAD", "C-LOCK")]


def _group(C=2, P=4, Q=16, cache=True):
    alloc = OwnerLaneAllocator(CPConfig(C, P, "rotation"), Q)
    return alloc, RequestFlow(alloc, PrefixCache(alloc) if cache else None)


def _prefill(flow, kv, start, end):
    a = flow.allocator.alloc_extend([start], [end - start], [kv.last_loc])
    kv.take(a.out_cache_loc_cpu, a.new_pages)
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
    kv.take(d.out_cache_loc_cpu, d.new_pages)
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
