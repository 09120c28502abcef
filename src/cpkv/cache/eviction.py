"""Eviction: free a lane's least recently used unlocked pages, their device subtrees with them (SPEC
section 8, C-RELOAD, C-LOCK).

``PrefixCache.evict`` pops the lane's least recently used run (``lru.py``), takes its device subtree and,
when the subtree alone is not enough, cuts the run at the page that frees exactly what is still needed;
locked runs are never popped. The runs leave the device ancestors first; with a host tier they are
written back (``writeback.py``) or dropped, and all their pages go to the allocator in one ``free``
call. An exception of ``backup_fn`` undoes the call (every page stays on device). ``docs/prefix-cache.md``
explains the order.
"""

from __future__ import annotations

import numpy as np

from .book import concat
from .results import LANE, PAGE
from .writeback import write_back

_NO_PAGES = np.zeros(0, dtype=np.int64)
_NO_PAGES.setflags(write=False)


def evict(cache, lane: int, num_pages: int) -> int:
    """``PrefixCache.evict`` for a checked ``lane`` and ``num_pages`` (see there): pages of ``lane`` freed."""
    freed, pages = take(cache, lane, num_pages)
    if pages.shape[0]:
        cache.allocator.free(pages)
    return freed


def evict_lanes(cache, short: list[int]) -> list[int]:
    """``PrefixCache.evict_lanes`` for checked ``short`` (pages wanted per lane, ints >= 0): ``evict(lane,
    short[lane])`` for each lane with a need, in lane order, with one ``free`` for all of them (each call's
    pages in front of the earlier calls', so every lane's free stack ends as after one ``free`` per call).
    With a host tier (write-back can fail and undo one lane's call) each lane frees at once."""
    if cache.book.write_back:
        return [evict(cache, lane, n) if n else 0 for lane, n in enumerate(short)]
    freed, parts = [0] * len(short), []
    for lane, n in enumerate(short):
        if n:
            freed[lane], pages = take(cache, lane, n)
            parts.append(pages)
    pages = concat(parts[::-1])
    if pages.shape[0]:
        cache.allocator.free(pages)
    return freed


def take(cache, lane: int, num_pages: int) -> tuple[int, np.ndarray]:
    """``evict`` but the allocator's ``free``: ``(pages of lane freed, every page that left the device, int64
    [n], ancestors first)``; the caller frees them."""
    book, lru, tree = cache.book, cache.lru, cache.tree
    steps: list[list] = []
    freed = 0
    while freed < num_pages:
        node = lru.pop(lane)
        if node is None:
            break
        if node.children:  # its device subtree goes too; 0 pages of the lane while ancestors are the newer
            below = tree.preorder(node, _on_device)[1:]
            got = sum(int(lru.counts(n)[lane]) for n in below)
        else:
            below, got = [], 0
        need = num_pages - freed - got
        if need > 0:  # cut the run at the need-th page of the lane from the bottom (or its first)
            idx = (node.vals[:, LANE] == lane).nonzero()[0]
            k = min(need, idx.shape[0])
            at = int(idx[idx.shape[0] - k])
            if at:
                tree.split(node, at, not book.write_back)
            got += k
            below.insert(0, node)
        else:  # the subtree alone is enough: the run stays
            lru.requeue(node)
        for n in below:
            n.dev, n.in_batch = False, True
            n.gen += 1
        freed += got
        steps.append(below)
    if steps:
        order = [n for step in reversed(steps) for n in step]  # ancestors first
        pages = concat([n.vals[:, PAGE] for n in order])
        taken = np.bincount(pages % cache.cp_size, minlength=cache.cp_size)  # [C] pages leaving the device
        book.account_eviction(pages, taken, lane, 1)
        if book.write_back:
            try:
                write_back(cache, order)
            except BaseException:
                book.account_eviction(pages, taken, lane, -1)
                for n in order:
                    n.dev, n.in_batch = True, False
                    n.gen -= 1
                    lru.requeue(n)
                raise
        else:
            for n in order:
                if n.attached:
                    tree.detach(n)
        book.changed()
        return freed, pages
    return freed, _NO_PAGES


def _on_device(n) -> bool:
    return n.dev
