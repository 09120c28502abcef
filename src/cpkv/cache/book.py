"""The prefix cache's books: page counts, counters, recency stamps and host-copy locations (SPEC section 8).

``CacheBook`` is the one interface through which ``PrefixCache`` and its helper modules
(``eviction.py``, ``loadback.py``, ``writeback.py``) change what the cache counts: device pages held by
the tree and those unlocked (per lane), the counters, the epoch a ``PrefixMatch`` is valid for, the LRU
stamps of runs and host copies, and which run holds each host copy. The tree itself (``radix.py``), the
eviction order (``lru.py``) and the host shards (``host_tier.py``) stay theirs; the book keeps their
counts in step with them.
"""

from __future__ import annotations

import numpy as np

from .host_tier import HostTier
from .lru import LaneLRU
from .radix import RadixTree
from .results import HKEY, LANE, PAGE

_I64 = np.int64
_EMPTY = np.zeros(0, dtype=_I64)
_EMPTY.setflags(write=False)

COUNTERS = (
    "hits",
    "misses",
    "matched_tokens",
    "host_matched_tokens",
    "inserted_pages",
    "duplicate_pages",
    "backups",
    "host_evictions",
    "host_dropped",
    "load_backs",
    "load_back_owner_lane_capacity_failed",
    "load_back_failed_pages",
)
"""The counters of ``PrefixCache.counters`` besides the per-lane eviction counts."""


class CacheBook:
    """The counts of one prefix cache, kept in step with its tree, LRU and host tier.

    Args:
        tree: the cache's ``RadixTree``. lru: its ``LaneLRU``. host: its ``HostTier``.
        num_pages: the allocator's page ids (``[0, num_pages)``). cp_size: C.

    Attributes:
        in_tree: bool ``[num_pages]``, page held by a device run. cached, evictable: int64 ``[C]`` device
            pages in the tree, and those unlocked. evicted: int64 ``[C]`` pages evicted per lane; own_lane:
            of them, those evicted by a call on their own lane. epoch: bumped by every change of pages (a
            match is valid for one epoch). n: the counters (``COUNTERS``). host_loc: host key -> the run
            holding the copy. write_back: evicted pages are written to the host tier (its capacity > 0).
    """

    def __init__(self, tree: RadixTree, lru: LaneLRU, host: HostTier, num_pages: int, cp_size: int) -> None:
        self.tree, self.lru, self.host = tree, lru, host
        C = cp_size
        self.in_tree = np.zeros(num_pages, dtype=bool)
        self.cached = np.zeros(C, dtype=_I64)
        self.evictable = np.zeros(C, dtype=_I64)
        self.evicted = np.zeros(C, dtype=_I64)
        self.own_lane = [0] * C
        self.host_loc: dict[int, object] = {}
        self.write_back = bool(host.capacity.any())
        self._next_key = 0
        self.epoch = 0
        self.n = dict.fromkeys(COUNTERS, 0)

    # ------------------------------------------------------------------------------------ counting
    def count(self, name: str, k: int = 1) -> None:
        """Add ``k`` to counter ``name`` (one of ``COUNTERS``)."""
        self.n[name] += k

    def changed(self) -> None:
        """Pages changed: every ``PrefixMatch`` made before is stale."""
        self.epoch += 1

    def new_host_key(self) -> int:
        """A fresh host-copy id (0, 1, 2, ... in write order: equal on every rank that replays the calls)."""
        self._next_key += 1
        return self._next_key - 1

    # ---------------------------------------------------------------------------------- LRU stamps
    def stamp(self, nodes: list) -> None:
        """Most recently used: the runs ``nodes``, one stamp, queued for eviction order."""
        s = self.tree.tick()
        for n in nodes:
            n.stamp = s
        self.lru.queue(nodes)

    def touch(self, nodes: list) -> None:
        """Most recently used: the nodes (one stamp) and their host copies, deepest first."""
        self.stamp(nodes)
        if self.host_loc:
            for n in reversed(nodes):
                keys, lanes = n.vals[:, HKEY], n.vals[:, LANE]
                for i in np.flatnonzero(keys >= 0)[::-1].tolist():
                    self.host.touch(int(keys[i]), int(lanes[i]))

    def touch_to(self, node, depth: int):
        """The run that ends at ``depth`` (``node`` holds page ``depth - 1``; split there if needed)."""
        return self.tree.split(node, depth - node.start) if depth < node.end else node

    # ------------------------------------------------------------------------------ page accounting
    def lock_changed(self, nodes: list, sign: int) -> None:
        """The device runs among ``nodes`` became locked (``sign`` -1: no longer evictable) or unlocked (+1)."""
        for n in nodes:
            if n.dev:
                if sign > 0:
                    self.evictable += self.lru.counts(n)
                else:
                    self.evictable -= self.lru.counts(n)

    def set_device(self, n, pages: np.ndarray) -> None:
        """Put device pages under run ``n`` (a new run, a refilled or a loaded-back one)."""
        n.vals[:, PAGE] = pages
        n.dev = True
        self.in_tree[pages] = True
        c = self.lru.counts(n)
        self.cached += c
        if n.lock_ref == 0:
            self.evictable += c

    def account_eviction(self, pages: np.ndarray, taken: np.ndarray, lane: int, sign: int) -> None:
        """The page counts of one ``evict`` call (``sign`` -1 undoes them): ``pages`` leave the device,
        ``taken`` int64 ``[C]`` of them per lane, all unlocked; those not of ``lane`` are collateral."""
        self.in_tree[pages] = sign < 0
        if sign < 0:
            taken = -taken
        self.cached -= taken
        self.evictable -= taken
        self.evicted += taken
        self.own_lane[lane] += int(taken[lane])


def concat(parts: list) -> np.ndarray:
    """One int64 array of the parts (a copy, never a view of the tree); empty for no parts."""
    if len(parts) == 1:
        return parts[0].astype(_I64)  # a contiguous copy
    return np.concatenate(parts, dtype=_I64) if parts else _EMPTY
