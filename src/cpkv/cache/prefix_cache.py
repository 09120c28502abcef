"""Prefix cache of one CP group over the owner-lane allocator (SPEC section 8: C-RELOAD, C-LOCK).

A radix tree of page runs (``radix.py``) keyed by token ids at page granularity; per page the device page
id (lane = ``page % C``, the owner) or, once evicted with write-back, a host copy and the **recorded owner
lane**. Load-back replays the recorded lanes; a lane still short after evicting on it ends the prefix
there (``load_back_owner_lane_capacity_failed``): no request waits on one lane.

Ownership contract (who frees what; the simulator and the executor rely on it):
- ``match_prefix`` changes no ownership; a caller that uses the matched pages across other cache calls
  must ``lock(match.handle)`` first (locked pages are never evicted).
- ``load_back`` allocates the loaded pages and gives them to the tree (not to the caller).
- ``insert(token_ids, slots)``: the tree takes every full page of ``slots`` and owns ``result.pages``; a
  duplicate caller page is freed, so the caller switches its ``req_to_token`` row to ``result.slots``. The
  partial last page stays the caller's.
- ``evict`` frees device pages back to the allocator (one ``free`` call per ``evict``); nothing else ever
  frees a tree page.

The engine flow (``flow.py`` as code), runs, handles, eviction order and write-back: docs/prefix-cache.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..allocator import OwnerLaneAllocator
from ..errors import PrefixCacheError
from .book import CacheBook, concat
from .checks import PageChecker, check_lane, int_array
from .eviction import evict, evict_lanes
from .host_tier import HostTier
from .loadback import load_back
from .lru import LaneLRU
from .radix import RadixNode, RadixTree
from .results import HKEY, LANE, PAGE, CacheEntry, InsertResult, PrefixMatch

_I64 = np.int64

__all__ = ["CacheEntry", "InsertResult", "PrefixCache", "PrefixMatch"]


class CacheNode(RadixNode):
    """A run of the prefix cache: ``vals`` columns PAGE (device page, -1 host-only), LANE (owner lane,
    recorded when host-only), HKEY (host copy id, -1 none)."""

    __slots__ = ("dev", "gen", "memo", "pushed", "in_batch")

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.dev = False  # on device (else host-only: every page has a host copy)
        self.gen = 0  # +1 whenever the pages leave the device: handles of older generations are stale
        self.memo: tuple | None = None  # (int64 [C] pages per lane, lanes present, C ints), dropped on split
        self.pushed = -1  # stamp of its entries on the eviction heaps
        self.in_batch = False  # taken by the evict call in progress


class PrefixCache:
    """Radix prefix cache of one CP group, lane-aware, with a bounded per-lane host tier (C-RELOAD, C-LOCK).

    Args:
        allocator: the group's ``OwnerLaneAllocator``; the cache frees evicted pages to it and allocates
            load-back pages from it (``alloc_pages`` on the recorded lanes).
        host_pages_per_lane: host-tier capacity in pages, an int >= 0 for every lane or C ints; 0 (the
            default) disables write-back, so evicted pages are dropped.
        backup_fn: ``backup_fn(page) -> payload`` copies a page's KV rows to host memory when it is evicted
            with write-back (called before the page is freed); None stores ``None`` (simulator).
        restore_fn: ``restore_fn(page, payload)`` writes a host copy into a freshly allocated device page
            during ``load_back``; None does nothing.

    Raises:
        PrefixCacheError: ``allocator`` is not an ``OwnerLaneAllocator``. ConfigError: a bad capacity.
    """

    def __init__(
        self,
        allocator: OwnerLaneAllocator,
        *,
        host_pages_per_lane: int | Sequence[int] = 0,
        backup_fn: Callable[[int], object] | None = None,
        restore_fn: Callable[[int, object], None] | None = None,
    ) -> None:
        if not isinstance(allocator, OwnerLaneAllocator):
            raise PrefixCacheError(f"allocator must be an OwnerLaneAllocator, got {type(allocator).__name__}")
        self.allocator = allocator
        self.cp_size = C = allocator.config.cp_size
        self.page_size = allocator.config.page_size
        self.host = HostTier(C, host_pages_per_lane)
        self.backup_fn = backup_fn
        self.restore_fn = restore_fn
        self.tree = RadixTree(self.page_size, 3, CacheNode, self._on_split)
        self._root_handle = self.tree.handle(self.tree.root, 0, 0)
        self.lru = LaneLRU(C)  # eviction order of the unlocked device runs
        self.book = CacheBook(
            self.tree, self.lru, self.host, allocator.num_pages, C
        )  # counts, stamps, copies
        self._check = PageChecker(allocator)

    # ----------------------------------------------------------------------------------------- queries
    def match_prefix(self, token_ids, *, record: bool = True) -> PrefixMatch:
        """Longest cached page-aligned prefix of ``token_ids`` (SPEC C-RELOAD).

        A match never exceeds the true shared prefix and is a whole number of pages (P=16, prompts sharing
        150 tokens: 144). Callers that must compute at least one token pass ``token_ids[:-1]``.

        Args:
            token_ids: ``[num_tokens]`` integer token ids (list, numpy or CPU tensor).
            record: when False, a read-only probe: no counters, no LRU stamp.

        Returns:
            ``PrefixMatch``: the device part, then the host-only part with its recorded lanes.

        Raises:
            PrefixCacheError: ``token_ids`` not 1-D integers.
        """
        tokens = int_array("token_ids", token_ids)
        path = self.tree.walk(tokens, tokens.shape[0] // self.page_size)
        if record and path and path[-1][1] < path[-1][0].num_pages:
            path[-1] = (self.tree.split(*path[-1]), path[-1][1])  # a stamp covers whole runs
        dev = [(n, m) for n, m in path if n.dev]
        host = path[len(dev) :]
        depth = sum(m for _, m in dev)
        book = self.book
        match = PrefixMatch(
            device_pages=concat([n.vals[:m, PAGE] for n, m in dev]),
            host_lanes=concat([n.vals[:m, LANE] for n, m in host]),
            page_size=self.page_size,
            handle=self.tree.handle(dev[-1][0], depth, dev[-1][0].gen) if dev else self._root_handle,
            _host_end=self.tree.handle(host[-1][0], depth + sum(m for _, m in host), 0) if host else None,
            _epoch=book.epoch,
        )
        if record:
            book.count("hits" if path else "misses")
            book.count("matched_tokens", match.prefix_len)
            book.count("host_matched_tokens", match.host_len)
            book.touch([n for n, _ in path])
        return match

    def cached_pages_per_lane(self) -> np.ndarray:
        """Device pages held by the tree (locked or not), per lane, int64 ``[C]``."""
        return self.book.cached.copy()

    def evictable_pages_per_lane(self) -> np.ndarray:
        """Unlocked device pages of the tree per lane, int64 ``[C]`` (what ``evict`` can free at most)."""
        return self.book.evictable.copy()

    def host_copies_per_lane(self) -> np.ndarray:
        """Host copies held per lane, int64 ``[C]`` (bounded by ``host_pages_per_lane``)."""
        return self.host.count_per_lane()

    @property
    def total_cached_pages(self) -> int:
        """Device pages held by the tree over all lanes, in pages."""
        return int(self.book.cached.sum())

    def counters(self) -> dict:
        """Counters (a fresh dict): ``hits``/``misses`` (match calls with / without a matched page),
        ``matched_tokens`` (device + host), ``host_matched_tokens``, ``inserted_pages`` (pages taken over
        from callers), ``duplicate_pages`` (caller pages freed by insert), ``evicted_pages`` (list [C],
        device pages evicted per lane), ``evicted_collateral_pages`` (list [C], those evicted while freeing
        another lane), ``backups`` (host copies written), ``host_evictions`` (copies dropped for host
        capacity), ``host_dropped`` (copies dropped with their page: below a dropped page, or a refilled
        page on another lane), ``load_backs`` (pages), ``load_back_owner_lane_capacity_failed`` (load-backs
        cut short by a full lane), ``load_back_failed_pages`` (host pages left to recompute).

        They add up: ``cached = inserted_pages + load_backs - sum(evicted_pages)`` and
        ``host copies = backups - host_evictions - host_dropped``.
        """
        out: dict = dict(self.book.n)
        out["evicted_pages"] = self.book.evicted.tolist()
        out["evicted_collateral_pages"] = [
            e - own for e, own in zip(out["evicted_pages"], self.book.own_lane, strict=True)
        ]
        return out

    def entries(self) -> Iterator[CacheEntry]:
        """Every cached page (device or host), runs parents first; a read-only view for tests and reports."""
        for n in self.tree.nodes():
            for i, (page, lane, key) in enumerate(n.vals.tolist()):
                yield CacheEntry(
                    n.start + i, page if n.dev else -1, lane, key >= 0, n.lock_ref, key if key >= 0 else None
                )

    # ----------------------------------------------------------------------------------------- locking
    def lock(self, handle) -> None:
        """Protect the handle's prefix (its pages and all ancestors) from eviction until the matching
        ``unlock(handle)`` (SPEC C-LOCK). Locks are counted per handle; the root's (empty) handle counts
        too. A handle of a longer prefix protects this one, never the other way round.

        Raises:
            PrefixCacheError: not a handle of this cache, or a stale one (its pages were evicted since it
                was returned; call match_prefix again). Nothing changes.
        """
        node, depth = self._resolve(handle)
        node, locked = self.tree.lock(node, depth)
        self.book.lock_changed(locked, -1)

    def unlock(self, handle) -> None:
        """Undo one ``lock`` taken through this handle (C-LOCK); pages whose last lock goes become
        evictable (most recently used).

        Raises:
            PrefixCacheError: a handle of another cache, a stale one, or one with no outstanding lock taken
                through it (e.g. the handle of a shorter prefix than the one locked). Nothing changes.
        """
        node, depth = self._resolve(handle)
        freed = self.tree.unlock(node, depth)
        if freed:
            self.book.stamp(freed)
            self.book.lock_changed(freed, 1)

    # ---------------------------------------------------------------------------------------- updates
    def insert(self, token_ids, slots, *, allocator_rows: bool = False) -> InsertResult:
        """Hand the full pages of a request (after a chunk or at the end) to the tree (SPEC C-RELOAD).

        Page i of the request must be one whole page: ``slots[i*P : (i+1)*P] == p*P + 0 .. P-1``. A page
        whose prefix the tree already holds on device is a duplicate: the caller's page is freed to the
        allocator and the tree's kept (switch ``req_to_token`` to ``result.slots``). A host-only page takes
        the caller's page (its host copy is dropped if the lane differs). See the ownership contract.

        Args:
            token_ids: ``[num_tokens]`` integer token ids of the request so far.
            slots: ``[num_tokens]`` integer slots of those tokens (the ``req_to_token`` row).
            allocator_rows: ``slots`` is a row as the allocator and this cache wrote it (``RequestFlow``):
                each page is checked by its first and last slot only, O(pages) in place of O(tokens).

        Returns:
            ``InsertResult`` for the ``num_tokens // P`` full pages.

        Raises:
            PrefixCacheError: mismatched lengths, a page that is not whole, page 0, a free page, a page
                listed twice, or a page the tree holds at another position. Nothing changes.
        """
        P = self.page_size
        tokens = int_array("token_ids", token_ids)
        slots = int_array("slots", slots)
        if slots.shape[0] != tokens.shape[0]:
            raise PrefixCacheError(f"slots has {slots.shape[0]} entries but token_ids has {tokens.shape[0]}")
        k = tokens.shape[0] // P
        pages = self._check.whole_pages(slots[: k * P], allocator_rows=allocator_rows)
        path = self.tree.walk(tokens, k)
        matched = sum(m for _, m in path)
        book = self.book
        held = book.in_tree[pages]  # [k]
        same = concat([n.vals[:m, PAGE] for n, m in path]) == pages[:matched]  # [matched] the tree's own page
        num_same = np.count_nonzero(same)
        if (
            np.count_nonzero(held) != num_same
        ):  # same implies held: a held page elsewhere; nothing changed yet
            held[:matched] &= ~same
            i = int(np.flatnonzero(held)[0])
            raise PrefixCacheError(
                f"page {int(pages[i])} (token {i * P}) is already cached at another position"
            )
        if path and path[-1][1] < path[-1][0].num_pages:
            path[-1] = (self.tree.split(*path[-1]), path[-1][1])
        nodes, dup, new, pos = [], [], 0, 0
        on_device = sum(m for n, m in path if n.dev)  # matched pages already on device
        for node, m in path:
            if not node.dev:
                self._refill(node, pages[pos : pos + m])
                new += m
            elif num_same < on_device:  # a caller page duplicates the tree's
                dup.append(pages[pos : pos + m][~same[pos : pos + m]])
            nodes.append(node)
            pos += m
        if matched < k:
            vals = np.empty((k - matched, 3), dtype=_I64)  # [pages, (PAGE, LANE, HKEY)]
            vals[:, PAGE] = pages[matched:]
            vals[:, LANE] = vals[:, PAGE] % self.cp_size
            vals[:, HKEY] = -1
            leaf = self.tree.add_leaf(
                nodes[-1] if nodes else self.tree.root, tokens[matched * P : k * P], vals
            )
            book.set_device(leaf, leaf.vals[:, PAGE])
            nodes.append(leaf)
            new += k - matched
        dup_pages = concat(dup)
        if dup_pages.shape[0]:
            self.allocator.free(dup_pages)
        book.count("inserted_pages", new)
        book.count("duplicate_pages", dup_pages.shape[0])
        book.changed()
        book.touch(nodes)
        handle = self.tree.handle(nodes[-1], k, nodes[-1].gen) if nodes else self._root_handle
        # Without duplicates every page of the result is the caller's (kept, refilled or new): ``pages``.
        result = pages if num_same == on_device else concat([n.vals[:, PAGE] for n in nodes])
        return InsertResult(result, dup_pages, new, P, handle)

    def evict(self, lane: int, num_pages: int) -> int:
        """Free at least ``num_pages`` unlocked pages of ``lane``, least recently used first (C-RELOAD).

        Evicting a page evicts its device descendants too (other lanes' pages among them are counted in
        ``evicted_collateral_pages``). With a host tier each evicted page is written back to its owner
        lane's host shard, dropping the shard's least recently used copies that no load-back pins and this
        call did not evict; a page that finds no room is dropped with everything below it. Locked pages are
        never evicted (C-LOCK). All freed pages go to the allocator in one ``free`` call.

        Returns:
            pages of ``lane`` freed (less than ``num_pages`` when too few are unlocked).

        Raises:
            PrefixCacheError: ``lane`` out of range or ``num_pages`` negative. An exception of
                ``backup_fn`` propagates after the call is undone (every page stays on device).
        """
        lane = check_lane(lane, self.cp_size)
        if type(num_pages) is not int or num_pages < 0:
            if isinstance(num_pages, bool) or not hasattr(num_pages, "__index__") or int(num_pages) < 0:
                raise PrefixCacheError(f"num_pages={num_pages!r} must be an integer >= 0")
            num_pages = int(num_pages)
        return evict(self, lane, num_pages)

    def evict_lanes(self, short) -> list[int]:
        """``evict(lane, short[lane])`` for every lane with ``short[lane] > 0``, in lane order, the freed pages
        going to the allocator in one ``free`` call (C-RELOAD): what a scheduler short on several lanes at
        once calls. Each lane evicts exactly as its own ``evict`` call would, and every lane's free pages
        end in the order those calls would leave.

        Args:
            short: ``[C]`` pages wanted per lane (ints >= 0: list, tuple or int64 array).

        Returns:
            pages freed per lane, ``C`` ints (a lane's figure is what its ``evict`` call returns).

        Raises:
            PrefixCacheError: ``short`` not ``C`` integers >= 0 (nothing is evicted). An exception of
                ``backup_fn`` propagates after its lane's call is undone (the lanes before it stay evicted).
        """
        wanted = int_array("short", short)
        if wanted.shape[0] != self.cp_size or (wanted.shape[0] and int(wanted.min()) < 0):
            raise PrefixCacheError(
                f"short must be {self.cp_size} integers >= 0 (one per lane), got {short!r}"
            )
        return evict_lanes(self, wanted.tolist())

    def load_back(self, match: PrefixMatch) -> PrefixMatch:
        """Bring the host-only part of ``match`` back to device on its recorded owner lanes (C-RELOAD).

        Lanes short of free pages are evicted on (``evict(lane, shortfall)``) and checked once more; the
        prefix is cut at the first page that still does not fit, counting
        ``load_back_owner_lane_capacity_failed``, and the request recomputes the rest. Never waits.

        Args:
            match: a ``PrefixMatch`` from this cache with no change of pages since (``match_prefix``).

        Returns:
            ``PrefixMatch`` of the usable prefix, all on device (``host_lanes`` empty); the loaded pages
            belong to the tree (lock the new handle to use them).

        Raises:
            PrefixCacheError: a stale match or a match of another cache. An exception of ``restore_fn``
                propagates; the pages restored before it stay loaded, the others go back to the allocator.
        """
        return load_back(self, match)

    # ------------------------------------------------------------------------------------- private
    def _resolve(self, handle) -> tuple[CacheNode, int]:
        """The live run holding a handle's last page, or PrefixCacheError for a stale handle."""
        node, depth = self.tree.resolve(handle)
        if depth and (not node.dev or node.gen != handle.gen):
            raise PrefixCacheError(
                f"stale handle: the pages of its {depth}-page prefix were evicted since it "
                "was returned; call match_prefix again"
            )
        return node, depth

    def _on_split(self, upper: CacheNode, lower: CacheNode) -> None:
        """The tree split a run: the new upper part takes its state; host keys in it now point to it."""
        upper.dev, upper.gen, upper.in_batch = lower.dev, lower.gen, lower.in_batch
        self.lru.forget(lower)
        host_loc = self.book.host_loc
        if host_loc:
            keys = upper.vals[:, HKEY]
            for key in keys[keys >= 0].tolist():
                host_loc[key] = upper
        self.lru.queue([upper])

    def _refill(self, n: CacheNode, pages: np.ndarray) -> None:
        """A host-only run takes the caller's pages; a copy whose lane differs from the page's is dropped."""
        lanes = pages % self.cp_size
        keys = n.vals[:, HKEY]
        book = self.book
        for i in np.flatnonzero((keys >= 0) & (lanes != n.vals[:, LANE])).tolist():
            self.host.pop(int(keys[i]), int(n.vals[i, LANE]))
            del book.host_loc[int(keys[i])]
            keys[i] = -1
            book.count("host_dropped")
        n.vals[:, LANE] = lanes
        self.lru.forget(n)
        book.set_device(n, pages)

    def new_host_key(self) -> int:
        """A fresh host-copy id (0, 1, 2, ... in write order: equal on every rank that replays the calls)."""
        return self.book.new_host_key()
