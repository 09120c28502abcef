"""Lane-aware LRU order of the prefix cache's runs (SPEC section 8, C-RELOAD eviction order).

``pop(lane)`` gives the unlocked device run holding the least recently used page of ``lane`` (oldest
stamp, deepest run on a tie), from lazily filled binary heaps of ``(stamp, -end, nid, run)``: O(log n)
per push and pop, amortised. The heap scheme: docs/prefix-cache.md, "The LRU heaps".
"""

from __future__ import annotations

import heapq

import numpy as np

from .results import LANE


class LaneLRU:
    """Per-lane LRU order of runs (see the module doc). A run is evictable when ``dev`` (on device),
    ``lock_ref == 0`` and ``attached``; its ``stamp``, ``end`` and ``nid`` order it, ``pushed`` and
    ``memo`` are this class's own (stamp of its entries; lane counts, memoised until the run splits).

    Args:
        cp_size: lanes, C >= 1.
    """

    def __init__(self, cp_size: int) -> None:
        self.cp_size = cp_size
        self._heaps: list[list] = [[] for _ in range(cp_size + 1)]  # one per lane, then the shared one
        self._limit = [1024] * (cp_size + 1)  # rebuild a heap when it grows past this
        self._queue: list = []  # runs to push at the next pop

    def counts(self, node) -> np.ndarray:
        """Pages of the run per lane, int64 ``[C]`` (memoised until the run splits: do not modify)."""
        return (node.memo or self._memo(node))[0]

    def queue(self, nodes: list) -> None:
        """Runs whose stamp changed or that may have become evictable (checked when pushed)."""
        self._queue.extend(nodes)

    def requeue(self, node) -> None:
        """A popped run that stays on device: its entries go back on the heaps."""
        node.pushed = -1
        self._queue.append(node)

    def forget(self, node) -> None:
        """The run's pages changed (split, refill): its lane counts are recomputed and it is pushed again
        (onto the lane heaps if it no longer has every lane)."""
        node.memo = None
        self.requeue(node)

    def pop(self, lane: int):
        """The evictable run with ``lane``'s least recently used page, taken off its heap (its other entries
        die with it once it is evicted); None when there is none."""
        if self._queue:
            self._push_queued()
        heap, shared, pop, C = self._heaps[lane], self._heaps[-1], heapq.heappop, self.cp_size
        while heap and not self._live(heap[0], lane):
            pop(heap)
        while shared and not self._live(shared[0], C):
            pop(shared)
        if heap and (not shared or heap[0][:3] <= shared[0][:3]):
            return pop(heap)[3]
        return pop(shared)[3] if shared else None

    # ---------------------------------------------------------------------------------------- private
    def _memo(self, node) -> tuple:
        c = np.bincount(node.vals[:, LANE], minlength=self.cp_size)
        per_lane = c.tolist()
        # (int64 [C] pages per lane, lanes with pages, the pages per lane as C ints)
        node.memo = (c, [r for r, k in enumerate(per_lane) if k], per_lane)
        return node.memo

    def _push_queued(self) -> None:
        heaps, push, C, memo = self._heaps, heapq.heappush, self.cp_size, self._memo
        for n in self._queue:  # a run queued again since its push (same stamp) is skipped first
            if n.pushed != n.stamp and n.dev and n.lock_ref == 0 and n.attached:
                n.pushed = n.stamp
                entry = (n.stamp, -n.end, n.nid, n)
                lanes = (n.memo or memo(n))[1]
                if len(lanes) == C:
                    push(heaps[C], entry)  # the shared heap
                else:
                    for r in lanes:
                        push(heaps[r], entry)
        self._queue.clear()
        for r, heap in enumerate(heaps):  # only grown heaps can be past their limit (pops only shrink)
            if len(heap) > self._limit[r]:
                heap[:] = [e for e in heap if self._live(e, r)]
                heapq.heapify(heap)
                self._limit[r] = 2 * len(heap) + 1024

    def _live(self, entry: tuple, heap: int) -> bool:
        """Whether an entry of heap ``heap`` (a lane, or C: the shared one) still names an evictable run at
        the run's stamp with pages on that lane (on every lane)."""
        n = entry[3]
        if not (n.stamp == entry[0] == n.pushed and n.dev and n.lock_ref == 0 and n.attached):
            return False
        memo = n.memo or self._memo(n)
        return len(memo[1]) == self.cp_size if heap == self.cp_size else memo[2][heap] > 0
