"""Differential test: the run-based prefix cache against the per-page reference model (SPEC section 8).

``tests/cache_reference.py`` states the cache's rules page by page with linear scans. Both run the same
calls on equal allocators (hypothesis stateful test: requests that match, load back, lock, allocate,
insert and finish, probes, evictions, load-backs and random lock/unlock of every handle ever returned,
on small pools with a tiny vocabulary so that prefixes share and diverge inside runs). After every step
they must agree exactly: every return value, which pages each evict frees and in what order (the two
allocators' free lists stay identical), every cached page with its lane, host copy and lock count, the
host tier's LRU order, and the counters. No difference is allowed: the model defines the semantics.
And no page is lost or owned twice: free + cached + held by running requests = the usable pool.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cache_reference import PROMPTS, RefCache, RefError
from cpkv import CPConfig, LaneExhausted, OwnerLaneAllocator, PrefixCacheError
from cpkv.cache import PrefixCache

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-RELOAD"), pytest.mark.clause("C-LOCK")]

INDEX = st.integers(0, 10**6)
MODELED = (
    "hits",
    "misses",
    "inserted_pages",
    "duplicate_pages",
    "backups",
    "host_evictions",
    "host_dropped",
    "load_backs",
    "load_back_owner_lane_capacity_failed",
    "load_back_failed_pages",
)


class Differential(RuleBasedStateMachine):
    @initialize(
        cp_size=st.integers(1, 3),
        page_size=st.sampled_from([1, 2, 3]),
        pages_per_lane=st.integers(3, 12),
        host=st.sampled_from([0, 1, 2, 5]),
        uneven=st.booleans(),
    )
    def setup(self, cp_size, page_size, pages_per_lane, host, uneven):
        self.C, self.P = cp_size, page_size
        caps = [pages_per_lane - r for r in range(cp_size)] if uneven else pages_per_lane
        make = lambda: OwnerLaneAllocator(CPConfig(cp_size, page_size, owner_policy="rotation"), caps)  # noqa: E731
        self.alloc, self.ref_alloc = make(), make()
        self.cache = PrefixCache(self.alloc, host_pages_per_lane=host)
        self.ref = RefCache(self.ref_alloc, host)
        self.handles = []  # (cache handle, model handle) of every match, insert and load-back
        self.held = []  # locks this test took through handles: indexes into self.handles
        self.running = []  # (tokens, slots, handle index, own pages) of requests not finished

    # ----------------------------------------------------------------------------------- helpers
    def match(self, tokens, record=True, load=False):
        m = self.cache.match_prefix(tokens, record=record)
        dev, lanes, h, host = self.ref.match(tokens.tolist(), record)
        assert m.device_pages.tolist() == dev and m.host_lanes.tolist() == lanes
        if load and host:
            m = self.cache.load_back(m)
            dev, h = self.ref.load_back(dev, host, h)
            assert m.device_pages.tolist() == dev and m.host_len == 0
        self.handles.append((m.handle, h))
        return m, len(self.handles) - 1

    def call_both(self, fn, ref_fn):
        """Run one call on both; they must both succeed or both refuse."""
        try:
            fn()
        except PrefixCacheError:
            with pytest.raises(RefError):
                ref_fn()
            return False
        ref_fn()
        return True

    def lock(self, i):
        return self.call_both(
            lambda: self.cache.lock(self.handles[i][0]), lambda: self.ref.lock(self.handles[i][1])
        )

    def unlock(self, i):
        return self.call_both(
            lambda: self.cache.unlock(self.handles[i][0]), lambda: self.ref.unlock(self.handles[i][1])
        )

    def alloc_extend(self, *args):
        for attempt in range(2):
            try:
                ext = self.alloc.alloc_extend(*args)
            except LaneExhausted as e:
                with pytest.raises(LaneExhausted):
                    self.ref_alloc.alloc_extend(*args)
                if attempt:
                    return None
                n = e.needed - e.available
                assert self.cache.evict(e.lane, n) == self.ref.evict(e.lane, n)
                continue
            assert ext.out_cache_loc.tolist() == self.ref_alloc.alloc_extend(*args).out_cache_loc.tolist()
            return ext
        return None

    def insert(self, tokens, slots):
        r = self.cache.insert(tokens, slots)
        pages, dup, new, h = self.ref.insert(tokens.tolist(), slots.tolist())
        assert (r.pages.tolist(), r.duplicate_pages.tolist(), r.new_pages) == (pages, dup, new)
        self.handles.append((r.handle, h))
        return r, len(self.handles) - 1

    # ------------------------------------------------------------------------------------- rules
    @rule(tokens=PROMPTS, load=st.booleans(), finish=st.booleans())
    def request(self, tokens, load, finish):
        t = np.asarray(tokens, dtype=np.int64)
        m, hm = self.match(t[:-1], load=load)
        assert self.lock(hm)
        ext = self.alloc_extend([m.device_len], [len(t) - m.device_len], [m.last_loc])
        if ext is None:
            assert self.unlock(hm)
            return
        slots = np.concatenate([m.device_slots, ext.out_cache_loc.numpy()])
        r, hr = self.insert(t, slots)
        assert self.lock(hr) and self.unlock(hm)
        tail = set((slots[r.slots.shape[0] :: self.P] // self.P).tolist())
        self.running.append((t, hr, tail))
        if finish:
            self.finish(len(self.running) - 1)

    @precondition(lambda self: self.running)
    @rule(i=INDEX)
    def finish(self, i):
        _, hr, tail = self.running.pop(i % len(self.running))
        assert self.unlock(hr)
        if tail:
            self.alloc.free(sorted(tail))
            self.ref_alloc.free(sorted(tail))

    @rule(tokens=PROMPTS, record=st.booleans(), load=st.booleans())
    def probe(self, tokens, record, load):
        self.match(np.asarray(tokens, dtype=np.int64), record=record or load, load=load)

    @rule(lane=st.integers(0, 2), n=st.integers(0, 8))
    def evict(self, lane, n):
        lane %= self.C
        assert self.cache.evict(lane, n) == self.ref.evict(lane, n)

    @rule(short=st.lists(st.integers(0, 6), min_size=3, max_size=3))
    def evict_lanes(self, short):
        # several lanes at once, one free: each lane as its own evict call, lane by lane, and the free lists
        # as those calls leave them (same_state compares the two allocators' digests)
        short = short[: self.C]
        assert self.cache.evict_lanes(short) == [
            self.ref.evict(lane, n) if n else 0 for lane, n in enumerate(short)
        ]

    @precondition(lambda self: self.handles)
    @rule(i=INDEX)
    def lock_any(self, i):
        i %= len(self.handles)
        if self.lock(i):
            self.held.append(i)

    @rule(i=INDEX, own=st.booleans())
    def unlock_any(self, i, own):
        if own and self.held:  # one this test locked (valid), else any handle (mostly invalid)
            j = self.held.pop(i % len(self.held))
            assert self.unlock(j)
        elif self.handles:
            j = i % len(self.handles)
            same = [k for k in self.held if self.handles[k][1] == self.handles[j][1]]  # the same handle
            if not same and any(self.handles[hr][1] == self.handles[j][1] for _, hr, _ in self.running):
                return  # only a running request's lock is held through it: that request releases it
            if self.unlock(j):
                self.held.remove(same[0])

    # -------------------------------------------------------------------------------- invariants
    @invariant()
    def same_state(self):
        assert [tuple(e) for e in self.cache.entries()] == self.ref.entries()
        c = self.cache.counters()
        assert {k: c[k] for k in MODELED} == self.ref.n
        assert (c["evicted_pages"], c["evicted_collateral_pages"]) == (self.ref.evicted, self.ref.collateral)
        assert list(self.cache.host.items()) == [(k, r) for r in range(self.C) for k in self.ref.host[r]]
        assert self.alloc.state_digest() == self.ref_alloc.state_digest()
        dev = [n for n in self.ref.pages() if n.page >= 0]
        cached = np.bincount([n.lane for n in dev], minlength=self.C)
        evictable = np.bincount([n.lane for n in dev if n.lock_ref == 0], minlength=self.C)
        assert self.cache.cached_pages_per_lane().tolist() == cached.tolist()
        assert self.cache.evictable_pages_per_lane().tolist() == evictable.tolist()

    @invariant()
    def every_page_once(self):
        # No page lost or owned twice: free pages + tree pages + the running requests' partial pages
        # are exactly the usable pool (page 0 and pages beyond a short lane's capacity excluded).
        alloc, C = self.alloc, self.C
        ids = np.arange(alloc.num_pages)
        usable = ids[(ids > 0) & (ids // C < alloc.lane_pages[ids % C])].tolist()
        free = ids[alloc.is_free(ids)].tolist()
        tree = [e.page for e in self.cache.entries() if e.page >= 0]
        held = [p for _, _, tail in self.running for p in tail]
        assert sorted(free + tree + held) == usable

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for _, hr, _ in self.running:
            self.cache.unlock(self.handles[hr][0])
        for j in self.held:
            self.cache.unlock(self.handles[j][0])
        for lane in range(self.C):
            self.cache.evict(lane, 10**6)
        assert self.cache.total_cached_pages == 0


def test_run_cache_equals_per_page_model():
    run_state_machine_as_test(
        Differential,
        settings=settings(
            max_examples=150,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
