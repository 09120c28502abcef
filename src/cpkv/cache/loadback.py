"""Load-back: host copies back to device on their recorded owner lanes (SPEC section 8, C-RELOAD).

``PrefixCache.load_back`` pins the matched prefix and the host runs it loads, evicts each recorded lane's
shortfall, allocates the pages that fit (``alloc_pages`` on the recorded lanes, in position order: a
replay, never a new phase), cuts the prefix at the first page that does not fit (counting
``load_back_owner_lane_capacity_failed``; the request recomputes the rest, it never waits), restores the
copies with ``restore_fn`` and stamps the whole path. Operates on the ``PrefixCache`` it is given,
through its public attributes and its ``CacheBook`` (``book.py``).
"""

from __future__ import annotations

import numpy as np

from ..errors import PrefixCacheError
from ..runs import offsets_within_key
from .results import HKEY, LANE, PrefixMatch

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.setflags(write=False)


def load_back(cache, match: PrefixMatch) -> PrefixMatch:
    """``PrefixCache.load_back`` (see there)."""
    book = cache.book
    if not isinstance(match, PrefixMatch) or match._epoch != book.epoch:
        raise PrefixCacheError("match is stale (the cache changed since match_prefix); match again")
    if match._host_end is None:
        return match
    end, depth = cache.tree.resolve(match._host_end)  # a match of another cache raises here
    if depth < end.end:
        end = cache.tree.split(end, depth - end.start)
    first = match.device_pages.shape[0]
    nodes, n = [], end
    while n.start >= first and n.parent is not None:
        nodes.append(n)
        n = n.parent
    lanes = match.host_lanes
    _pin(cache, end, 1)  # pins the device prefix and the host copies being loaded
    try:
        need = np.bincount(lanes, minlength=cache.cp_size)
        for r in np.flatnonzero(need).tolist():  # re-read: evicting a lane may free others (collateral)
            short = int(need[r] - cache.allocator.free_pages_per_lane()[r])
            if short > 0:
                cache.evict(r, short)
        free = cache.allocator.free_pages_per_lane()
        fits = _rank_within_lane(lanes) < free[lanes]  # page i fits if its lane has room for it
        j = int(lanes.shape[0]) if fits.all() else int(np.argmin(fits))
        pages = cache.allocator.alloc_pages(lanes[:j])
        last = _fill(cache, nodes[::-1], pages)
    finally:
        _pin(cache, end, -1)
    if j < lanes.shape[0]:
        book.count("load_back_owner_lane_capacity_failed")
        book.count("load_back_failed_pages", int(lanes.shape[0]) - j)
    book.changed()
    if last is None:
        node, handle = book.touch_to(*cache.tree.resolve(match.handle)), match.handle
    else:
        node, handle = last, cache.tree.handle(last, first + j, last.gen)
    book.touch(cache.tree.path(node))  # the whole path, so ancestors stay newer than descendants
    return PrefixMatch(
        np.concatenate([match.device_pages, pages]), _EMPTY, cache.page_size, handle, None, book.epoch
    )


def _pin(cache, node, delta: int) -> None:
    """A lock without a handle on the path to ``node`` (load-back pins what it works on)."""
    crossed = cache.tree.adjust(node, delta)
    if delta < 0 and crossed:
        cache.book.stamp(crossed)
    cache.book.lock_changed(crossed, -delta)


def _fill(cache, nodes: list, pages: np.ndarray):
    """Restore ``pages`` (allocated on the recorded lanes) into the host-only runs ``nodes`` (root side
    first), splitting the last one where the pages end; returns the last run loaded (None if none). A failing ``restore_fn`` keeps the pages restored
    before it and frees the rest."""
    done, last, j = 0, None, pages.shape[0]
    try:
        for n in nodes:
            if done == j:
                break
            take = min(n.num_pages, j - done)
            if take < n.num_pages:
                n = cache.tree.split(n, take)
            seg = pages[done : done + take]
            if cache.restore_fn is not None:
                copies = zip(n.vals[:, HKEY].tolist(), n.vals[:, LANE].tolist(), strict=True)
                for i, (key, lane) in enumerate(copies):
                    try:
                        cache.restore_fn(int(seg[i]), cache.host.get(key, lane))
                    except BaseException:
                        if i:
                            part = cache.tree.split(n, i)
                            cache.book.set_device(part, seg[:i])
                            cache.book.count("load_backs", i)
                            done += i
                        raise
            cache.book.set_device(n, seg)
            cache.book.count("load_backs", take)
            done += take
            last = n
    except BaseException:
        cache.allocator.free(pages[done:])  # a failing restore_fn leaks nothing
        cache.book.changed()
        raise
    return last


def _rank_within_lane(lanes: np.ndarray) -> np.ndarray:
    """Index of each entry among the earlier entries of the same lane: ``[2,0,2,2,0] -> [0,0,1,2,1]``."""
    ones = np.ones_like(lanes)
    return offsets_within_key(lanes, ones, np.bincount(lanes, minlength=int(lanes.max(initial=-1)) + 1))
