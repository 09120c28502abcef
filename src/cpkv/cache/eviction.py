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


def evict(cache, lane: int, num_pages: int) -> int:
    """``PrefixCache.evict`` for a checked ``lane`` and ``num_pages`` (see there): pages of ``lane`` freed."""
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
        cache.allocator.free(pages)
        book.changed()
    return freed


def _on_device(n) -> bool:
    return n.dev
