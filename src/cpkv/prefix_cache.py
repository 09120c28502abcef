"""Radix prefix cache over the owner-lane allocator, with a host tier (SPEC section 8, C-RELOAD).

The tree has one node per **full page** of tokens: a node's key is the bytes of its P token ids (int64),
so a match is always a whole number of pages and a partial last page is never shared. A node holds its
device page (lane = ``page % C``, the owner) or, once evicted with write-back, a host copy and its
**recorded owner lane**. Device-resident nodes form a prefix-closed set: below a host-only node every node
is host-only. Load-back replays the recorded lanes (never a recomputed phase); when a lane is short it
evicts on that lane, retries once, then gives up on the rest of the prefix (recompute) and counts
``load_back_owner_lane_capacity_failed``: no request ever waits on one lane.

Ownership contract (who frees what; the simulator and the executor rely on it):
- ``match_prefix`` changes no ownership. Matched device pages belong to the tree; a caller that uses them
  across other cache calls must ``lock(match.handle)`` first (locked pages are never evicted).
- ``load_back`` allocates the loaded pages and gives them to the tree (not to the caller).
- ``insert(token_ids, slots)``: the caller hands over every full page of ``slots``. Afterwards the tree
  owns ``result.pages``; a caller page that duplicated a cached page was freed back to the allocator, so
  the caller must switch its ``req_to_token`` row to ``result.slots``. The partial last page stays the
  caller's, to free itself (or to hand over by a later ``insert`` once full).
- ``evict`` frees device pages back to the allocator; nothing else ever frees a tree page.

Engine flow for one request (``t`` its token ids, ``row`` its ``req_to_token`` slots)::

    m = cache.load_back(cache.match_prefix(t[:-1]))   # load_back right after the match (else: stale)
    cache.lock(m.handle)
    ext = alloc.alloc_extend([m.device_len], [len(t) - m.device_len], [m.last_loc])
    #   on LaneExhausted e: cache.evict(e.lane, e.needed - e.available), retry once
    row = concat(m.device_slots, ext.out_cache_loc)
    r = cache.insert(t, row); row[:len(r.slots)] = r.slots      # after each chunk and at the end
    cache.lock(r.handle); cache.unlock(m.handle)                # move the lock to the longer prefix
    # finished: cache.unlock(r.handle); alloc.free([row[len(r.slots)] // P]) if a partial page is left

Every decision is deterministic (insertion-ordered dicts, LRU lists), so the ranks of a group that replay
the same calls keep identical trees; ``backup_fn`` / ``restore_fn`` of rank r move only lane r's pages.
Per-call cost is O(pages) dict look-ups plus numpy work over the tokens; there is no per-token loop.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .allocator import OwnerLaneAllocator
from .errors import PlanError, PrefixCacheError
from .host_tier import HostTier
from .planner import _as_int_array, offsets_within_key

_I64 = np.int64
_EMPTY = np.zeros(0, dtype=_I64)
_EMPTY.setflags(write=False)

__all__ = ["CacheEntry", "InsertResult", "PrefixCache", "PrefixMatch"]


class _Node:
    """One full page of the radix tree (private; handed to callers as an opaque lock handle)."""

    __slots__ = ("parent", "key", "children", "page", "lane", "lock_ref", "on_host", "attached", "_digest")

    def __init__(self, parent: _Node | None, key: bytes) -> None:
        self.parent = parent
        self.key = key  # bytes of the page's P int64 token ids
        self.children: dict[bytes, _Node] = {}
        self.page = -1  # device page id, -1 when host-only
        self.lane = -1  # owner lane: page % C while on device, the recorded lane once host-only
        self.lock_ref = 0  # locks held on this node or on a descendant (inc/dec along the path)
        self.on_host = False
        self.attached = True
        self._digest: bytes | None = b"" if parent is None else None

    def digest(self) -> bytes:
        """Content key: blake2b-128 chained over every page from the root, so it names the whole prefix."""
        chain, n = [], self
        while n._digest is None:
            chain.append(n)
            n = n.parent  # type: ignore[assignment]
        for m in reversed(chain):
            m._digest = hashlib.blake2b(m.parent._digest + m.key, digest_size=16).digest()  # type: ignore[union-attr,operator]
        return self._digest  # type: ignore[return-value]


@dataclass(frozen=True, eq=False)
class PrefixMatch:
    """Result of ``match_prefix`` / ``load_back`` (SPEC C-RELOAD). Immutable.

    Attributes:
        device_pages: ``[device_len // P]`` int64 device page ids of the matched prefix, in position order.
        host_lanes: ``[host_len // P]`` int64 recorded owner lanes of the pages that follow the device part
            and live only in the host tier (empty after ``load_back``).
        page_size: P, in tokens.
        handle: opaque lock handle of the last device page (``lock`` / ``unlock``).
    """

    device_pages: np.ndarray
    host_lanes: np.ndarray
    page_size: int
    handle: object = field(repr=False)
    _host_nodes: tuple = field(default=(), repr=False)
    _epoch: int = field(default=-1, repr=False)

    @property
    def device_len(self) -> int:
        """Tokens of the prefix already on device (a multiple of P)."""
        return int(self.device_pages.shape[0]) * self.page_size

    @property
    def host_len(self) -> int:
        """Tokens after ``device_len`` that only the host tier holds (a multiple of P)."""
        return int(self.host_lanes.shape[0]) * self.page_size

    @property
    def prefix_len(self) -> int:
        """All matched tokens, ``device_len + host_len`` (page aligned, never past the shared prefix)."""
        return self.device_len + self.host_len

    @property
    def device_slots(self) -> np.ndarray:
        """``[device_len]`` int64 slots ``p*P + 0 .. P-1`` of every device page (``req_to_token`` row)."""
        return _page_slots(self.device_pages, self.page_size)

    @property
    def last_loc(self) -> int:
        """Slot of position ``device_len - 1`` (``last_loc`` for ``alloc_extend``), -1 when nothing matched."""
        n = self.device_pages.shape[0]
        return int(self.device_pages[-1]) * self.page_size + self.page_size - 1 if n else -1


@dataclass(frozen=True, eq=False)
class InsertResult:
    """Result of ``insert`` (SPEC C-RELOAD). The tree owns ``pages``; see the module's ownership contract.

    Attributes:
        pages: ``[num_tokens // P]`` int64 tree page ids of the inserted full pages, in position order.
        duplicate_pages: int64 caller pages that duplicated cached pages and were freed to the allocator.
        new_pages: pages the tree took over from the caller (new nodes and host-only nodes refilled).
        page_size: P, in tokens.
        handle: opaque lock handle of the last inserted page (the root when no page was full).
    """

    pages: np.ndarray
    duplicate_pages: np.ndarray
    new_pages: int
    page_size: int
    handle: object = field(repr=False)

    @property
    def slots(self) -> np.ndarray:
        """``[len(pages) * P]`` int64 slots to write into the request's ``req_to_token`` row."""
        return _page_slots(self.pages, self.page_size)


class CacheEntry(NamedTuple):
    """One cached page, as ``PrefixCache.entries`` lists it (read-only view for tests and reports)."""

    depth: int  # page index in its prefix (0 = the first page of a prompt)
    page: int  # device page id, -1 when host-only
    lane: int  # owner lane (the recorded lane when host-only)
    on_host: bool  # whether the host tier holds a copy
    lock_ref: int
    host_key: bytes | None  # content key of the host copy, None when not on host


class PrefixCache:
    """Radix prefix cache of one CP group, lane-aware, with a bounded per-lane host tier (C-RELOAD).

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
        self._root = _Node(None, b"")
        self._lru: list[OrderedDict[_Node, None]] = [OrderedDict() for _ in range(C)]  # unlocked device nodes
        self._page_node: dict[int, _Node] = {}  # device page -> node
        self._host_node: dict[bytes, _Node] = {}  # host key -> node
        self._cached = np.zeros(C, dtype=_I64)  # [C] device pages in the tree
        self._epoch = 0  # bumped by every structural change; a match is valid for one epoch
        self._n = {k: 0 for k in ("hits", "misses", "matched_tokens", "host_matched_tokens", "inserted_pages",
                                  "duplicate_pages", "backups", "host_evictions", "host_dropped", "load_backs",
                                  "load_back_owner_lane_capacity_failed", "load_back_failed_pages")}
        self._evicted = np.zeros(C, dtype=_I64)
        self._collateral = np.zeros(C, dtype=_I64)

    # ----------------------------------------------------------------------------------------- queries
    def match_prefix(self, token_ids, *, record: bool = True) -> PrefixMatch:
        """Longest cached page-aligned prefix of ``token_ids`` (SPEC C-RELOAD).

        A match never exceeds the true shared prefix and is a whole number of pages (P=16, prompts sharing
        150 tokens: 144). Callers that must compute at least one token pass ``token_ids[:-1]``.

        Args:
            token_ids: ``[num_tokens]`` integer token ids (list, numpy or CPU tensor).
            record: when False, a read-only probe: no counters, no LRU update.

        Returns:
            ``PrefixMatch``: the device part, then the host-only part with its recorded lanes.

        Raises:
            PrefixCacheError: ``token_ids`` not 1-D integers.
        """
        node, path, n_dev = self._root, [], 0
        for key in self._page_keys(token_ids):
            node = node.children.get(key)  # type: ignore[assignment]
            if node is None:
                break
            path.append(node)
            n_dev += node.page >= 0
        dev, host = path[:n_dev], path[n_dev:]
        match = PrefixMatch(
            device_pages=np.fromiter((n.page for n in dev), dtype=_I64, count=n_dev),
            host_lanes=np.fromiter((n.lane for n in host), dtype=_I64, count=len(host)),
            page_size=self.page_size,
            handle=dev[-1] if dev else self._root,
            _host_nodes=tuple(host),
            _epoch=self._epoch,
        )
        if record:
            self._n["hits" if path else "misses"] += 1
            self._n["matched_tokens"] += match.prefix_len
            self._n["host_matched_tokens"] += match.host_len
            self._touch(path)
        return match

    def cached_pages_per_lane(self) -> np.ndarray:
        """Device pages held by the tree (locked or not), per lane, int64 ``[C]``."""
        return self._cached.copy()

    def evictable_pages_per_lane(self) -> np.ndarray:
        """Unlocked device pages of the tree per lane, int64 ``[C]`` (what ``evict`` can free at most)."""
        return np.asarray([len(d) for d in self._lru], dtype=_I64)

    def host_copies_per_lane(self) -> np.ndarray:
        """Host copies held per lane, int64 ``[C]`` (bounded by ``host_pages_per_lane``)."""
        return self.host.count_per_lane()

    @property
    def total_cached_pages(self) -> int:
        """Device pages held by the tree over all lanes, in pages."""
        return int(self._cached.sum())

    def counters(self) -> dict:
        """Counters (a fresh dict): ``hits``/``misses`` (match calls with / without a matched page),
        ``matched_tokens`` (device + host), ``host_matched_tokens``, ``inserted_pages`` (pages taken over
        from callers), ``duplicate_pages`` (caller pages freed by insert), ``evicted_pages`` (list [C],
        device pages evicted per lane), ``evicted_collateral_pages`` (list [C], those evicted while freeing
        another lane), ``backups`` (host copies written), ``host_evictions`` (copies dropped for host
        capacity), ``host_dropped`` (copies dropped with their node: below a dropped page, or a refilled
        page on another lane), ``load_backs`` (pages), ``load_back_owner_lane_capacity_failed`` (load-backs
        cut short by a full lane), ``load_back_failed_pages`` (host pages left to recompute).

        They add up: ``cached = inserted_pages + load_backs - sum(evicted_pages)`` and
        ``host copies = backups - host_evictions - host_dropped``.
        """
        out: dict = dict(self._n)
        out["evicted_pages"] = self._evicted.tolist()
        out["evicted_collateral_pages"] = self._collateral.tolist()
        return out

    def entries(self) -> Iterator[CacheEntry]:
        """Every cached page (device or host), depth first; a read-only view for tests and reports."""
        stack = [(c, 0) for c in self._root.children.values()]
        while stack:
            n, d = stack.pop()
            yield CacheEntry(d, n.page, n.lane, n.on_host, n.lock_ref, n.digest() if n.on_host else None)
            stack.extend((c, d + 1) for c in n.children.values())

    # ----------------------------------------------------------------------------------------- locking
    def lock(self, handle) -> None:
        """Lock the pages from the root to ``handle`` (a match's or insert's handle): never evicted until
        ``unlock``. Locks nest (a count per page). Locking the root (empty match) is a no-op.

        Raises:
            PrefixCacheError: a handle of another cache, or one whose page was evicted since.
        """
        node = self._check_handle(handle)
        if node.page < 0 and node is not self._root:
            raise PrefixCacheError("handle's page was evicted since it was returned; call match_prefix again")
        self._lock_path(node)

    def unlock(self, handle) -> None:
        """Undo one ``lock(handle)``; the pages become evictable (most recently used) at lock count 0.

        Raises:
            PrefixCacheError: a handle of another cache, or one that is not locked.
        """
        node = self._check_handle(handle)
        if node is not self._root and node.lock_ref == 0:
            raise PrefixCacheError("unlock without lock: the handle's lock count is 0")
        self._unlock_path(node)

    # ---------------------------------------------------------------------------------------- updates
    def insert(self, token_ids, slots) -> InsertResult:
        """Hand the full pages of a request (after a chunk or at the end) to the tree (SPEC C-RELOAD).

        Page i of the request must be one whole page: ``slots[i*P : (i+1)*P] == p*P + 0 .. P-1``. A page
        whose prefix the tree already holds on device is a duplicate: the caller's page is freed to the
        allocator and the tree's kept (switch ``req_to_token`` to ``result.slots``). A host-only node takes
        the caller's page (its host copy is dropped if the lane differs). See the ownership contract.

        Args:
            token_ids: ``[num_tokens]`` integer token ids of the request so far.
            slots: ``[num_tokens]`` integer slots of those tokens (the ``req_to_token`` row).

        Returns:
            ``InsertResult`` for the ``num_tokens // P`` full pages.

        Raises:
            PrefixCacheError: mismatched lengths, a page that is not whole, page 0, a free page, a page
                listed twice, or a page the tree holds at another position. Nothing changes.
        """
        P = self.page_size
        token_ids = self._int_array("token_ids", token_ids)
        slots = self._int_array("slots", slots)
        if slots.shape[0] != token_ids.shape[0]:
            raise PrefixCacheError(f"slots has {slots.shape[0]} entries but token_ids has {token_ids.shape[0]}")
        keys = self._page_keys(token_ids)
        k = len(keys)
        pages = self._whole_pages(slots[: k * P].reshape(k, P))
        path, node = [], self._root
        for key in keys:
            node = node.children.get(key)  # type: ignore[assignment]
            if node is None:
                break
            path.append(node)
        for i, p in enumerate(pages.tolist()):  # validate fully before changing anything
            held = self._page_node.get(p)
            if held is not None and (i >= len(path) or path[i] is not held):
                raise PrefixCacheError(f"page {p} (token {i * P}) is already cached at another position")
        dup, new = [], 0
        node = path[-1] if path else self._root
        for i, p in enumerate(pages.tolist()):
            if i < len(path):
                n = path[i]
                if n.page >= 0:
                    if n.page != p:
                        dup.append(p)
                    continue
            else:
                n = _Node(node, keys[i])
                node.children[n.key] = n
                node = n
                path.append(n)
            self._set_page(n, p)
            new += 1
        dup_pages = np.asarray(dup, dtype=_I64)
        self.allocator.free(dup_pages)
        self._n["inserted_pages"] += new
        self._n["duplicate_pages"] += len(dup)
        self._epoch += 1
        self._touch(path)
        tree_pages = np.fromiter((n.page for n in path), dtype=_I64, count=k)
        return InsertResult(tree_pages, dup_pages, new, P, path[-1] if path else self._root)

    def evict(self, lane: int, num_pages: int) -> int:
        """Free at least ``num_pages`` unlocked pages of ``lane``, least recently used first (C-RELOAD).

        Evicting a page evicts its device descendants too (deepest first; other lanes' pages among them
        are counted in ``evicted_collateral_pages``). With a host tier each evicted page is written back to
        its owner lane's host shard (an LRU copy there is dropped when the shard is full); without one, or
        when the shard holds only pinned copies, the page and its host-only descendants are dropped.

        Returns:
            pages of ``lane`` freed (less than ``num_pages`` when too few are unlocked).

        Raises:
            PrefixCacheError: ``lane`` out of range or ``num_pages`` negative.
        """
        lane = self._check_lane(lane)
        if isinstance(num_pages, bool) or not hasattr(num_pages, "__index__") or int(num_pages) < 0:
            raise PrefixCacheError(f"num_pages={num_pages!r} must be an integer >= 0")
        num_pages = int(num_pages)
        freed, to_free, lru = 0, [], self._lru[lane]
        try:
            while freed < num_pages and lru:
                for n in self._device_subtree(next(iter(lru))):
                    self._evict_node(n, to_free)
                    freed += n.lane == lane
                    self._collateral[n.lane] += n.lane != lane
        finally:
            if to_free:
                self.allocator.free(to_free)
                self._epoch += 1
        return freed

    def load_back(self, match: PrefixMatch) -> PrefixMatch:
        """Bring the host-only part of ``match`` back to device on its recorded owner lanes (C-RELOAD).

        Lanes short of free pages are evicted on (``evict(lane, shortfall)``) and checked once more; the
        prefix is cut at the first page that still does not fit, counting
        ``load_back_owner_lane_capacity_failed``, and the request recomputes the rest. Never waits.

        Args:
            match: a ``PrefixMatch`` from this cache with no structural change since (``match_prefix``).

        Returns:
            ``PrefixMatch`` of the usable prefix, all on device (``host_lanes`` empty); the loaded pages
            belong to the tree (lock the new handle to use them).

        Raises:
            PrefixCacheError: a stale match or a match of another cache.
        """
        if not isinstance(match, PrefixMatch) or match._epoch != self._epoch:
            raise PrefixCacheError("match is stale (the cache changed since match_prefix); match again")
        nodes = match._host_nodes
        if not nodes:
            return match
        self._check_handle(nodes[-1])  # a match of another cache raises here
        lanes = match.host_lanes
        self._lock_path(nodes[-1])  # pins the device prefix and the host copies being loaded
        try:
            need = np.bincount(lanes, minlength=self.cp_size)
            for r in np.flatnonzero(need).tolist():  # re-read: evicting a lane may free others (collateral)
                short = int(need[r] - self.allocator.free_pages_per_lane()[r])
                if short > 0:
                    self.evict(r, short)
            free = self.allocator.free_pages_per_lane()
            fits = _rank_within_lane(lanes) < free[lanes]  # page i fits if its lane has room for it
            j = int(lanes.shape[0]) if fits.all() else int(np.argmin(fits))
            pages = self.allocator.alloc_pages(lanes[:j])
            done = 0
            try:
                for n, p in zip(nodes[:j], pages.tolist(), strict=True):
                    if self.restore_fn is not None:
                        self.restore_fn(p, self.host.get(n.digest(), n.lane))
                    self._set_page(n, p)
                    self._n["load_backs"] += 1
                    done += 1
            except BaseException:
                self.allocator.free(pages[done:])  # a failing restore_fn leaks nothing
                self._epoch += 1
                raise
        finally:
            self._unlock_path(nodes[-1])
        if j < len(nodes):
            self._n["load_back_owner_lane_capacity_failed"] += 1
            self._n["load_back_failed_pages"] += len(nodes) - j
        self._epoch += 1
        handle = nodes[j - 1] if j else match.handle
        self._touch(self._path_to(handle))  # the whole path, so ancestors stay newer than descendants
        return PrefixMatch(np.concatenate([match.device_pages, pages]), _EMPTY, self.page_size, handle,
                           (), self._epoch)

    # ---------------------------------------------------------------------------------------- private
    def _page_keys(self, token_ids) -> list[bytes]:
        """Bytes of each full page's P int64 token ids: ``[num_tokens // P]`` keys, no per-token loop."""
        arr = np.ascontiguousarray(self._int_array("token_ids", token_ids), dtype=_I64)
        step = self.page_size * 8
        buf = arr[: (arr.shape[0] // self.page_size) * self.page_size].tobytes()
        return [buf[i : i + step] for i in range(0, len(buf), step)]

    @staticmethod
    def _int_array(name: str, values) -> np.ndarray:
        try:
            return _as_int_array(name, values, None)
        except PlanError as e:
            raise PrefixCacheError(str(e)) from None

    def _whole_pages(self, full: np.ndarray) -> np.ndarray:
        """Page ids of ``[k, P]`` slot rows, checking each row is one whole, held, distinct page."""
        P = self.page_size
        pages = full[:, 0] // P
        bad = np.flatnonzero((full != (pages * P)[:, None] + np.arange(P, dtype=_I64)).any(axis=1))
        if bad.size:
            i = int(bad[0])
            raise PrefixCacheError(f"slots of page {i} (tokens {i * P}..{i * P + P - 1}) are not one whole "
                                   f"page: {full[i, :8].tolist()}...")
        bad = pages[(pages <= 0) | (pages >= self.allocator.num_pages)]
        if bad.size:
            raise PrefixCacheError(f"page {int(bad[0])} cannot be cached (page 0 or out of range)")
        C, lane_pages = self.cp_size, self.allocator.lane_pages
        bad = pages[pages // C >= lane_pages[pages % C]]
        if bad.size:
            p = int(bad[0])
            raise PrefixCacheError(f"page {p} does not exist: lane {p % C} holds {int(lane_pages[p % C])} pages")
        bad = pages[self.allocator.is_free(pages)]
        if bad.size:
            raise PrefixCacheError(f"page {int(bad[0])} is free in the allocator: insert only pages you hold")
        uniq, cnt = np.unique(pages, return_counts=True)
        if (cnt > 1).any():
            raise PrefixCacheError(f"page {int(uniq[cnt > 1][0])} is listed more than once")
        return pages

    def _check_lane(self, lane) -> int:
        if isinstance(lane, bool) or not hasattr(lane, "__index__") or not 0 <= int(lane) < self.cp_size:
            raise PrefixCacheError(f"lane={lane!r} out of range [0, {self.cp_size})")
        return int(lane)

    def _check_handle(self, handle) -> _Node:
        if not isinstance(handle, _Node) or not handle.attached:
            raise PrefixCacheError("not a live handle of this cache (evicted, or from another cache)")
        n = handle
        while n.parent is not None:
            n = n.parent
        if n is not self._root:
            raise PrefixCacheError("handle belongs to another PrefixCache")
        return handle

    def _path_to(self, node: _Node) -> list[_Node]:
        """Nodes from the root's child down to ``node`` (empty for the root)."""
        path = []
        while node is not self._root:
            path.append(node)
            node = node.parent  # type: ignore[assignment]
        return path[::-1]

    def _touch(self, path: list[_Node]) -> None:
        """Most recently used: the path, root side newest (so deeper pages are evicted first)."""
        for n in reversed(path):
            if n.page >= 0 and n.lock_ref == 0:
                self._lru[n.lane].move_to_end(n)
            if n.on_host:
                self.host.touch(n.digest(), n.lane)

    def _lock_path(self, node: _Node) -> None:
        while node is not self._root:
            if node.lock_ref == 0 and node.page >= 0:
                del self._lru[node.lane][node]
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def _unlock_path(self, node: _Node) -> None:
        while node is not self._root:
            node.lock_ref -= 1
            if node.lock_ref == 0 and node.page >= 0:
                self._lru[node.lane][node] = None
            node = node.parent  # type: ignore[assignment]

    def _set_page(self, n: _Node, page: int) -> None:
        """Put a device page under node ``n`` (new, refilled or loaded back)."""
        lane = page % self.cp_size
        if n.on_host and n.lane != lane:  # refilled on another lane: the copy's recorded lane is stale
            self._drop_host(n)
            self._n["host_dropped"] += 1
        n.page, n.lane = page, lane
        self._page_node[page] = n
        self._cached[lane] += 1
        if n.lock_ref == 0:
            self._lru[lane][n] = None

    @staticmethod
    def _device_subtree(node: _Node) -> list[_Node]:
        """``node`` and its device descendants, every child before its parent (reversed preorder)."""
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(c for c in n.children.values() if c.page >= 0)
        return out[::-1]

    def _evict_node(self, n: _Node, to_free: list[int]) -> None:
        """Take an unlocked device page off node ``n``: write back if possible, else drop the node."""
        p, lane = n.page, n.lane
        if not n.on_host and self._make_host_room(lane):
            payload = self.backup_fn(p) if self.backup_fn is not None else None  # before any change to n
            self.host.put(n.digest(), lane, payload)
            self._host_node[n.digest()] = n
            n.on_host = True
            self._n["backups"] += 1
        del self._lru[lane][n]
        del self._page_node[p]
        self._cached[lane] -= 1
        self._evicted[lane] += 1
        to_free.append(p)
        n.page = -1
        if not n.on_host:
            self._remove_subtree(n)

    def _make_host_room(self, lane: int) -> bool:
        """Make room for one copy on host ``lane``: drop its LRU copy that is not pinned by a load-back."""
        if int(self.host.capacity[lane]) == 0:
            return False
        if not self.host.is_full(lane):
            return True
        for key in self.host.lru_keys(lane):
            victim = self._host_node[key]
            if victim.page >= 0 or victim.lock_ref == 0:
                break
        else:
            return False
        self._drop_host(victim)
        self._n["host_evictions"] += 1
        if victim.page < 0:
            self._remove_subtree(victim)
        return True

    def _drop_host(self, n: _Node) -> None:
        key = n.digest()
        self.host.pop(key, n.lane)
        del self._host_node[key]
        n.on_host = False

    def _remove_subtree(self, node: _Node) -> None:
        """Detach a host-only (or emptied) node and its host-only descendants, dropping their copies."""
        del node.parent.children[node.key]  # type: ignore[union-attr]
        stack = [node]
        while stack:
            n = stack.pop()
            if n.on_host:
                self._drop_host(n)
                self._n["host_dropped"] += 1
            n.attached = False
            stack.extend(n.children.values())
            n.children = {}


def _page_slots(pages: np.ndarray, page_size: int) -> np.ndarray:
    """``[len(pages) * P]`` slots: e.g. pages ``[3, 5]``, P=4 -> ``[12,13,14,15, 20,21,22,23]``."""
    return ((pages * page_size)[:, None] + np.arange(page_size, dtype=_I64)).reshape(-1)


def _rank_within_lane(lanes: np.ndarray) -> np.ndarray:
    """Index of each entry among the earlier entries of the same lane: ``[2,0,2,2,0] -> [0,0,1,2,1]``."""
    ones = np.ones_like(lanes)
    return offsets_within_key(lanes, ones, np.bincount(lanes, minlength=int(lanes.max(initial=-1)) + 1))
