"""One request's KV through a CP group's allocator and prefix cache: the engine flow, written once.

The ownership contract of ``PrefixCache`` (its module docstring) as code, for every engine that drives cpkv
(the simulator and the distributed executor alike):

1. ``RequestFlow.start``: match the longest cached prefix of the prompt (at least one token is left to
   compute), load a host-tier part back on its recorded owner lanes (C-RELOAD), lock it (C-LOCK); the
   request's ``req_to_token`` row starts with the prefix's slots;
2. ``RequestKV.take``: each step appends the slots the allocation gave the request (its part of the batch,
   ``request_part``) and the pages it took, which are the request's own until the tree holds them;
3. ``RequestKV.share`` (optional, after any step): hand the full pages computed so far to the tree and hold
   them through the new lock (a duplicate page is freed by the cache, the row switches to the tree's);
4. ``RequestKV.finish``: hand the full pages to the tree, unlock, free the pages it still holds on its own
   (the partly filled last page, decode pages), in position order; or ``RequestKV.release`` (a retracted
   request, or after ``share``): unlock and free the pages it holds on its own, the cached prefix stays.

Pages are freed through the allocator's public ``free`` only. Without a prefix cache (``cache=None``) a
request matches nothing, shares nothing, and frees every page it took.
"""

from __future__ import annotations

import numpy as np

_I64 = np.int64
_EMPTY = np.zeros(0, dtype=_I64)
_EMPTY.setflags(write=False)


class RequestFlow:
    """The requests of one CP group: its allocator, its prefix cache (or None) and a scratch page bitmap.

    Args:
        allocator: the group's ``OwnerLaneAllocator`` (``free``, ``num_pages``).
        cache: its ``PrefixCache``, or None (no prefix sharing).
    """

    def __init__(self, allocator, cache=None) -> None:
        self.allocator, self.cache = allocator, cache
        self._mark = np.zeros(
            allocator.num_pages, dtype=bool
        )  # scratch of _drop_tree_pages, False between calls

    def start(self, match_tokens: np.ndarray, capacity: int) -> RequestKV:
        """A request whose cached prefix matches ``match_tokens`` (int64 ``[n]``: the prompt minus at least its
        last token), locked; its row has room for ``capacity`` slots (prompt + output), in positions."""
        kv = RequestKV(self, capacity)
        if self.cache is not None:
            match = self.cache.match_prefix(match_tokens)
            if match.host_len:
                match = self.cache.load_back(match)
            self.cache.lock(match.handle)
            kv.handle = match.handle
            n = match.device_len
            match.write_device_slots(kv.slots)
            kv.length = kv.cached = n
        return kv


class RequestKV:
    """One request's KV (see the module docstring): its ``req_to_token`` row, its lock, its own pages.

    Attributes:
        slots: int64 ``[capacity]`` the ``req_to_token`` row; ``slots[:length]`` are set (``take`` grows it past
            the capacity given at start).
        length: positions with a slot (cached prefix + computed), tokens.
        cached: leading positions whose pages the tree holds for it (through ``handle``), tokens.
        handle: the cache's lock handle (None without a cache).
        own_pages: arrays of pages it took and the tree does not hold, in position order.
    """

    def __init__(self, flow: RequestFlow, capacity: int) -> None:
        self.flow = flow
        self.slots = np.empty(capacity, dtype=_I64)  # written as positions get KV
        self.length = 0
        self.cached = 0
        self.handle = None
        self.own_pages: list[np.ndarray] = []

    @property
    def row(self) -> np.ndarray:
        """``[length]`` int64 slots of the positions with KV (a view)."""
        return self.slots[: self.length]

    @property
    def last_loc(self) -> int:
        """Slot of the last position with KV, -1 when none (``alloc_extend``'s ``last_loc``)."""
        return int(self.slots[self.length - 1]) if self.length else -1

    @property
    def num_own_pages(self) -> int:
        """Pages it holds on its own (not the tree's)."""
        return sum(p.shape[0] for p in self.own_pages)

    def take(
        self, allocation, i: int, tokens: int | None = None, pages: int | None = None, *, host_slots=None
    ) -> int:
        """Append request ``i``'s part of a step's batch ``allocation`` (``request_part``): its slots, for
        positions ``length ..``, and the new pages it took, in position order. ``tokens`` / ``pages``: keep only
        the first so many of them (speculative decode keeps the accepted prefix; the other pages went back
        through ``release_tail``). ``host_slots``: as for ``request_part``. Returns the positions appended.
        Example: a decode step's ``take(a, 2)`` appends request 2's one slot (and its page, when the slot
        starts one) and returns 1."""
        slots, new_pages = request_part(allocation, i, host_slots)
        if tokens is not None:
            slots = slots[:tokens]
        if pages is not None:
            new_pages = new_pages[:pages]
        n = slots.shape[0]
        if self.length + n > self.slots.shape[0]:  # past the capacity given at start (decode steps): grow
            grown = np.empty(max(2 * self.slots.shape[0], self.length + n), dtype=_I64)
            grown[: self.length] = self.slots[: self.length]
            self.slots = grown
        self.slots[self.length : self.length + n] = slots
        self.length += n
        if new_pages.shape[0]:
            self.own_pages.append(new_pages)
        return n

    def share(self, token_ids) -> None:
        """Hand the full pages of its first ``len(token_ids)`` positions (``token_ids``: their ids, a sequence
        or int64 array) to the prefix cache and hold them through the new lock; the row takes the tree's
        slots (a duplicate page was freed by the cache). No-op without a cache."""
        cache = self.flow.cache
        if cache is None:
            return
        res = cache.insert(token_ids, self.slots[: len(token_ids)], allocator_rows=True)
        tree = res.slots
        self.slots[: tree.shape[0]] = tree
        cache.lock(res.handle)
        cache.unlock(self.handle)
        self.handle = res.handle
        self.cached = tree.shape[0]
        self._drop_tree_pages(res)

    def finish(self, token_ids) -> None:
        """Done: hand the full pages of its first ``len(token_ids)`` positions to the cache, unlock, and free
        the pages it still holds on its own (the partly filled last page, decode pages), in position order."""
        cache = self.flow.cache
        if cache is not None:
            res = cache.insert(token_ids, self.slots[: len(token_ids)], allocator_rows=True)
            cache.unlock(self.handle)
            self._drop_tree_pages(res)
        self._free_own()

    def release(self) -> None:
        """Unlock its cached prefix (which stays in the cache) and free every page it holds on its own."""
        if self.flow.cache is not None:
            self.flow.cache.unlock(self.handle)
        self._free_own()

    def _drop_tree_pages(self, res) -> None:
        """Own pages the tree now holds (``res.pages``) or freed as duplicates are no longer its own."""
        if not self.own_pages:
            return
        own = np.concatenate(self.own_pages) if len(self.own_pages) > 1 else self.own_pages[0]
        mark = self.flow._mark
        mark[res.pages] = True
        mark[res.duplicate_pages] = True
        rest = own[~mark[own]]
        mark[res.pages] = False
        mark[res.duplicate_pages] = False
        self.own_pages = [rest] if rest.shape[0] else []

    def _free_own(self) -> None:
        own = self.own_pages
        self.own_pages = []
        if own:
            self.flow.allocator.free(np.concatenate(own) if len(own) > 1 else own[0])


def request_part(allocation, i: int, host_slots: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Request ``i``'s part of a batch ``allocation`` (``ExtendAllocation``), as views: its slots, int64
    ``[E_i]`` (``out_cache_loc`` from ``plan.extend_indptr[i]`` to ``[i + 1]``), and its new pages, int64
    ``[m_i]`` (``new_pages`` from ``plan.page_indptr[i]`` to ``[i + 1]``). ``host_slots``: the batch's
    ``out_cache_loc`` already on the host (one copy from a device for the whole batch); default
    ``allocation.out_cache_loc_cpu``. Example: E = [3, 1] from prefix 0 at P = 2: request 1's part is the
    last slot and the last page."""
    plan = allocation.plan
    ind, page_ind = plan.extend_indptr, plan.page_indptr
    out = allocation.out_cache_loc_cpu if host_slots is None else host_slots
    return out[ind[i] : ind[i + 1]], allocation.new_pages[page_ind[i] : page_ind[i + 1]]
