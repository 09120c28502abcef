"""Stateful property test of the prefix cache over the owner-lane allocator (SPEC C-RELOAD).

Requests start (match, optional load-back, lock, allocate), extend, insert, finish or abort, interleaved
with probes, pins, evictions and load-backs, on small pools with a tiny vocabulary so prefixes collide,
under both CP strategies (C-INTERLEAVE: load-back replays the recorded lanes whatever the split).
The test keeps its own model, independent of the cache's internals:
- which pages each request holds (the caller's side of the ownership contract);
- what each device page "contains" (the token prefix whose K/V was written into it): written when a
  request fills a page, copied to the host payload by ``backup_fn`` and back by ``restore_fn``;
- every full-page prefix ever inserted, with the lane of the page the tree took for it.
Checked after every step: every usable page is free, in the tree or held by a request, exactly once;
host copies are exactly the tree's host entries (never orphaned) and within capacity; lock counts and
the per-lane queries agree with the tree; locked prefixes are intact; counters add up. Every match is
page aligned, never past an inserted prefix, has the right contents, and reports recorded lanes.

C-LOCK: every handle the cache returns (matches, probes inside runs, inserts, load-backs) joins a pool;
random rules lock and unlock pool handles, valid or not (stale, split, never locked). The test predicts
validity from what it observes, not from the cache's internals: a handle names a page-aligned prefix
and the *generation* of that prefix, which goes up whenever the prefix is seen to leave the device
(checked after every cache call that can evict or load). ``lock`` is valid for a current generation on
device (or the empty prefix); ``unlock`` when a lock through the same prefix and generation is held. An
invalid call must raise PrefixCacheError and leave the whole observable state (every page, lock counts,
counters, host copies, allocator free lists) unchanged.
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

from cache_reference import PROMPTS
from cpkv import CPConfig, LaneExhausted, OwnerLaneAllocator, PrefixCacheError
from cpkv.cache import PrefixCache

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-RELOAD"), pytest.mark.clause("C-LOCK")]

INDEX = st.integers(0, 10**6)
POOL = 16  # handles kept for the lock/unlock rules


class Req:
    """A running request as the engine sees it: tokens, req_to_token row, lock, pages it owns."""

    def __init__(self, tokens, slots, handle, locked, owned):
        self.tokens = tokens  # int64 [n]
        self.slots = slots  # int64 [n]
        self.handle = handle  # locked cache handle
        self.locked = locked  # pages locked through handle (the prefix)
        self.owned = owned  # set of page ids the request owns (not in the tree)


class PrefixCacheMachine(RuleBasedStateMachine):
    @initialize(
        cp_size=st.integers(1, 3),
        page_size=st.sampled_from([1, 2, 4]),
        pages_per_lane=st.integers(3, 12),
        host=st.sampled_from([0, 1, 3, 8]),
        uneven=st.booleans(),
        strategy=st.sampled_from(["zigzag", "interleave"]),
    )
    def setup(self, cp_size, page_size, pages_per_lane, host, uneven, strategy):
        self.C, self.P = cp_size, page_size
        caps = [pages_per_lane - r for r in range(cp_size)] if uneven else pages_per_lane  # unequal lanes
        self.alloc = OwnerLaneAllocator(CPConfig(cp_size, page_size, "rotation", strategy), caps)
        self.content = {}  # page -> tuple of token ids its K/V encodes (None once freed)
        self.cache = PrefixCache(
            self.alloc,
            host_pages_per_lane=host,
            backup_fn=self.content.get,
            restore_fn=self.content.__setitem__,
        )
        self.host_cap = host
        self.reqs: list[Req] = []
        self.pins = []  # (handle, tokens, device pages) of extra locks
        self.inserted = set()  # every full-page prefix ever inserted (tuples)
        self.lane_of = {}  # prefix tuple -> lane of the page the tree took for it last
        self.matches = 0
        self.pool = []  # (handle, prefix tuple, generation when returned)
        self.gen = {}  # prefix tuple -> generation (goes up each time the prefix leaves the device)
        self.seen = {}  # prefix tuple -> its device pages when last observed, None when not on device
        self.extra = {}  # (prefix, generation) -> locks taken by lock_any

    # ------------------------------------------------------------------------------------- helpers
    def prefix(self, tokens, j):
        return tuple(tokens[: (j + 1) * self.P].tolist())

    def match(self, tokens, record=True):
        m = self.cache.match_prefix(tokens, record=record)
        self.matches += record
        self.check_match(tokens, m)
        self.remember(m.handle, tokens[: m.device_len])
        return m

    # C-LOCK model ---------------------------------------------------------------------------------
    def remember(self, handle, prefix_tokens):
        """Add a handle just returned to the pool, with its prefix's current generation."""
        key = tuple(prefix_tokens.tolist())
        if key not in self.gen:
            self.gen[key] = 0
        self.seen[key] = self.device_pages(key)
        if len(self.pool) < POOL:
            self.pool.append((handle, key, self.gen[key]))

    def device_pages(self, key):
        n = len(key) // self.P
        m = self.cache.match_prefix(np.asarray(key, dtype=np.int64), record=False)
        return tuple(m.device_pages[:n].tolist()) if m.device_pages.shape[0] >= n else None

    def observe(self):
        """After a call that can evict or load: a prefix seen on device that is gone (or on other pages)
        left the device, so its generation goes up."""
        for key in self.gen:
            now = self.device_pages(key)
            if self.seen[key] is not None and now != self.seen[key]:
                self.gen[key] += 1
            self.seen[key] = now

    def held_locks(self, key):
        """Locks the other rules hold through handles of prefix ``key`` (always current generation)."""
        n = sum(tuple(r.tokens[: r.locked * self.P].tolist()) == key for r in self.reqs)
        return n + sum(tuple(t[: p.shape[0] * self.P].tolist()) == key for _, t, p in self.pins)

    def snapshot(self):
        return (
            list(self.cache.entries()),
            self.cache.counters(),
            self.cache.evictable_pages_per_lane().tolist(),
            self.cache.cached_pages_per_lane().tolist(),
            list(self.cache.host.items()),
            self.alloc.state_digest(),
        )

    def refused(self, call, handle):
        before = self.snapshot()
        with pytest.raises(PrefixCacheError):
            call(handle)
        assert self.snapshot() == before

    def check_match(self, tokens, m):
        P = self.P
        assert m.prefix_len % P == 0 and m.prefix_len <= len(tokens)
        n_dev = m.device_pages.shape[0]
        assert m.device_slots.tolist() == [p * P + o for p in m.device_pages.tolist() for o in range(P)]
        lanes = (m.device_pages % self.C).tolist() + m.host_lanes.tolist()
        for j, lane in enumerate(lanes):
            pre = self.prefix(tokens, j)
            assert pre in self.inserted  # never past a prefix that was actually inserted
            assert lane == self.lane_of[pre]  # the recorded owner lane
            if j < n_dev:
                assert self.content[int(m.device_pages[j])] == pre

    def load_back(self, m, tokens):
        before = self.cache.counters()
        n_dev, n_host = m.device_pages.shape[0], m.host_lanes.shape[0]
        back = self.cache.load_back(m)
        self.observe()
        self.remember(back.handle, tokens[: back.device_len])
        after = self.cache.counters()
        k = back.device_pages.shape[0] - n_dev
        assert back.host_len == 0 and 0 <= k <= n_host
        assert back.device_pages[:n_dev].tolist() == m.device_pages.tolist()
        assert (back.device_pages[n_dev:] % self.C).tolist() == m.host_lanes[:k].tolist()
        assert after["load_backs"] - before["load_backs"] == k
        failed = (
            after["load_back_owner_lane_capacity_failed"] - before["load_back_owner_lane_capacity_failed"]
        )
        assert failed == (k < n_host)
        assert after["load_back_failed_pages"] - before["load_back_failed_pages"] == n_host - k
        return back

    def alloc_extend(self, prefix_len, extend_len, last_loc):
        """Allocate; on LaneExhausted evict the shortfall on that lane and retry once (may raise)."""
        try:
            return self.alloc.alloc_extend([prefix_len], [extend_len], [last_loc])
        except LaneExhausted as e:
            self.cache.evict(e.lane, e.needed - e.available)
            self.observe()
            return self.alloc.alloc_extend([prefix_len], [extend_len], [last_loc])

    def write(self, req):
        """The request computed its tokens: each full page it owns now holds its prefix."""
        pages = req.slots[:: self.P] // self.P
        for j, p in enumerate(pages.tolist()):
            if p in req.owned and (j + 1) * self.P <= len(req.tokens):
                self.content[p] = self.prefix(req.tokens, j)

    def free(self, pages):
        self.alloc.free(sorted(pages))
        for p in pages:
            self.content[p] = None

    def insert(self, req):
        P = self.P
        res = self.cache.insert(req.tokens, req.slots)
        self.observe()
        k = res.pages.shape[0]
        self.remember(res.handle, req.tokens[: k * P])
        assert k == len(req.tokens) // P
        assert res.pages[: req.locked].tolist() == (req.slots[: req.locked * P : P] // P).tolist()
        dup = set(res.duplicate_pages.tolist())
        assert dup <= req.owned and self.alloc.is_free(res.duplicate_pages).all()
        for p in dup:
            self.content[p] = None
        for j, p in enumerate(res.pages.tolist()):
            pre = self.prefix(req.tokens, j)
            assert self.content[p] == pre
            self.inserted.add(pre)
            self.lane_of[pre] = p % self.C
        req.slots[: k * P] = res.slots
        req.owned -= set(res.pages.tolist()) | dup
        assert req.owned == set((req.slots[k * P :: P] // P).tolist())  # only the partial last page
        self.cache.lock(res.handle)
        self.cache.unlock(req.handle)
        req.handle, req.locked = res.handle, k

    # --------------------------------------------------------------------------------------- rules
    @rule(tokens=PROMPTS, load=st.booleans())
    def start(self, tokens, load):
        t = np.asarray(tokens, dtype=np.int64)
        m = self.match(t[:-1])  # compute at least one token
        if load and m.host_len:
            m = self.load_back(m, t[:-1])
            self.check_match(t[:-1], m)
        self.cache.lock(m.handle)
        try:
            ext = self.alloc_extend(m.device_len, len(t) - m.device_len, m.last_loc)
        except LaneExhausted:
            self.cache.unlock(m.handle)
            return
        slots = np.concatenate([m.device_slots, ext.out_cache_loc.numpy()])
        req = Req(t, slots, m.handle, m.device_pages.shape[0], set(ext.new_pages.tolist()))
        self.write(req)
        self.reqs.append(req)

    @rule(tokens=PROMPTS, load=st.booleans())
    def whole_request(self, tokens, load):
        n = len(self.reqs)
        self.start(tokens, load)
        if len(self.reqs) > n:
            self.end(n, True)

    @precondition(lambda self: self.reqs)
    @rule(i=INDEX, more=PROMPTS)
    def extend(self, i, more):
        req = self.reqs[i % len(self.reqs)]
        try:
            ext = self.alloc_extend(len(req.tokens), len(more), int(req.slots[-1]))
        except LaneExhausted:
            return
        req.tokens = np.concatenate([req.tokens, np.asarray(more, dtype=np.int64)])
        req.slots = np.concatenate([req.slots, ext.out_cache_loc.numpy()])
        req.owned |= set(ext.new_pages.tolist())
        self.write(req)

    @precondition(lambda self: self.reqs)
    @rule(i=INDEX)
    def insert_chunk(self, i):
        self.insert(self.reqs[i % len(self.reqs)])

    @precondition(lambda self: self.reqs)
    @rule(i=INDEX, finish=st.booleans())
    def end(self, i, finish):
        req = self.reqs.pop(i % len(self.reqs))
        if finish:
            self.insert(req)
        self.cache.unlock(req.handle)
        self.free(req.owned)

    @rule(tokens=PROMPTS)
    def probe(self, tokens):
        self.match(np.asarray(tokens, dtype=np.int64))

    @rule(tokens=PROMPTS)
    def load(self, tokens):
        t = np.asarray(tokens, dtype=np.int64)
        m = self.match(t)
        if m.host_len:
            self.check_match(t, self.load_back(m, t))

    @rule(tokens=PROMPTS)
    def pin(self, tokens):
        t = np.asarray(tokens, dtype=np.int64)
        m = self.match(t)
        self.cache.lock(m.handle)
        self.pins.append((m.handle, t, m.device_pages.copy()))

    @precondition(lambda self: self.pins)
    @rule(i=INDEX)
    def unpin(self, i):
        handle, _, _ = self.pins.pop(i % len(self.pins))
        self.cache.unlock(handle)

    @rule(lane=st.integers(0, 2), n=st.integers(0, 6))
    def evict(self, lane, n):
        lane %= self.C
        before = self.cache.counters()
        evictable = int(self.cache.evictable_pages_per_lane()[lane])
        freed = self.cache.evict(lane, n)
        self.observe()
        after = self.cache.counters()
        assert min(n, evictable) <= freed <= evictable
        d_ev = [a - b for a, b in zip(after["evicted_pages"], before["evicted_pages"], strict=True)]
        d_col = [
            a - b
            for a, b in zip(
                after["evicted_collateral_pages"], before["evicted_collateral_pages"], strict=True
            )
        ]
        assert d_ev[lane] == freed and d_col[lane] == 0
        assert all(d_ev[r] == d_col[r] for r in range(self.C) if r != lane)

    @rule(tokens=PROMPTS, cut=st.integers(0, 12), record=st.booleans())
    def grab(self, tokens, cut, record):
        """A handle of a prefix that may end inside a run (record=False does not split it)."""
        self.match(np.asarray(tokens, dtype=np.int64)[: cut * self.P], record=record)

    @precondition(lambda self: self.pool)
    @rule(i=INDEX)
    def lock_any(self, i):
        handle, key, gen = self.pool[i % len(self.pool)]
        if not key or (gen == self.gen[key] and self.seen[key] is not None):
            self.cache.lock(handle)
            self.extra[key, gen] = self.extra.get((key, gen), 0) + 1
        else:  # its pages left the device since the handle was returned
            self.refused(self.cache.lock, handle)

    @precondition(lambda self: self.pool)
    @rule(i=INDEX)
    def unlock_any(self, i):
        handle, key, gen = self.pool[i % len(self.pool)]
        if self.extra.get((key, gen), 0):
            self.cache.unlock(handle)
            self.extra[key, gen] -= 1
        elif gen != self.gen[key] or not self.held_locks(key):  # stale, or never locked
            self.refused(self.cache.unlock, handle)
        # else: only another rule's lock is held through it; releasing that would break that rule

    # ---------------------------------------------------------------------------------- invariants
    @invariant()
    def every_page_once(self):
        C, alloc = self.C, self.alloc
        ids = np.arange(alloc.num_pages)
        usable = ids[(ids > 0) & (ids // C < alloc.lane_pages[ids % C])].tolist()
        free = ids[alloc.is_free(ids)].tolist()
        tree = [e.page for e in self.cache.entries() if e.page >= 0]
        held = [p for r in self.reqs for p in r.owned]
        assert sorted(free + tree + held) == usable

    @invariant()
    def host_copies_match_the_tree(self):
        entries = list(self.cache.entries())
        assert all(e.page >= 0 or e.on_host for e in entries)  # no node without any copy
        on_host = [(e.host_key, e.lane) for e in entries if e.on_host]
        held = list(self.cache.host.items())
        assert sorted(on_host) == sorted(held) and len(set(held)) == len(held)
        assert (self.cache.host_copies_per_lane() <= self.host_cap).all()

    @invariant()
    def locks_and_lane_counts(self):
        entries = list(self.cache.entries())
        expected = sum(r.locked for r in self.reqs) + sum(p.shape[0] for _, _, p in self.pins)
        expected += sum(len(key) // self.P * n for (key, _), n in self.extra.items())
        assert sum(e.lock_ref for e in entries) == expected
        dev = [e for e in entries if e.page >= 0]
        assert all(e.page % self.C == e.lane for e in dev)
        cached = np.bincount([e.lane for e in dev], minlength=self.C)
        unlocked = np.bincount([e.lane for e in dev if e.lock_ref == 0], minlength=self.C)
        assert self.cache.cached_pages_per_lane().tolist() == cached.tolist()
        assert self.cache.evictable_pages_per_lane().tolist() == unlocked.tolist()
        for req in self.reqs:  # locked prefixes are still on device, same pages
            m = self.cache.match_prefix(req.tokens, record=False)
            pages = (req.slots[: req.locked * self.P : self.P] // self.P).tolist()
            assert m.device_pages[: req.locked].tolist() == pages
        for _, tokens, pages in self.pins:
            m = self.cache.match_prefix(tokens, record=False)
            assert m.device_pages[: pages.shape[0]].tolist() == pages.tolist()

    @invariant()
    def counters_add_up(self):
        c = self.cache.counters()
        assert self.cache.total_cached_pages == c["inserted_pages"] + c["load_backs"] - sum(
            c["evicted_pages"]
        )
        assert len(self.cache.host) == c["backups"] - c["host_evictions"] - c["host_dropped"]
        assert c["hits"] + c["misses"] == self.matches
        assert all(
            0 <= x <= y for x, y in zip(c["evicted_collateral_pages"], c["evicted_pages"], strict=True)
        )
        if self.host_cap == 0:
            assert c["backups"] == 0 and c["load_backs"] == 0

    def teardown(self):
        # Everything unwinds: finishing every request and unpinning leaves no lock and no leaked page.
        if not hasattr(self, "cache"):
            return
        for req in self.reqs:
            self.cache.unlock(req.handle)
            self.free(req.owned)
        for handle, _, _ in self.pins:
            self.cache.unlock(handle)
        for handle, key, gen in self.pool:
            while self.extra.get((key, gen), 0):
                self.cache.unlock(handle)
                self.extra[key, gen] -= 1
        self.reqs, self.pins = [], []
        for lane in range(self.C):
            self.cache.evict(lane, 10**6)
        assert self.cache.total_cached_pages == 0
        assert self.alloc.free_pages_per_lane().tolist() == self.alloc.capacity_per_lane.tolist()


@pytest.mark.slow
def test_prefix_cache_state_machine():
    run_state_machine_as_test(
        PrefixCacheMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
