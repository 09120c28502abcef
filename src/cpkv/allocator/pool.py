"""The page pool of one CP group: per-lane stacks of free page ids and the handed-out bitmap (SPEC C-ALLOC).

``LanePool`` knows pages and lanes, never plans or policies: ``pick`` chooses pages off the lanes' stacks
without taking them, ``commit`` takes what was picked, ``release`` gives pages back, ``check_held`` and
``valid_last_locs`` answer the checks callers make before they allocate or free (C-FAIL-FAST), so a
caller picks, builds what it needs, then commits: all or nothing (C-ATOMIC). Page p lives on lane
``p % C``; page 0 is reserved for padding writes and never handed out; a fresh pool hands out the lowest
ids of each lane first, and the same calls always give the same pages (every rank replays them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AllocatorError, LaneExhausted
from ..runs import expand_runs, offsets_within_key

_I64 = np.int64
_SMALL = 32  # up to this many one-page runs are placed in Python by pick_one_each (cheaper than pick)


class LanePool:
    """Free pages of ``C`` lanes of unequal capacity (SPEC C-ALLOC).

    Args:
        lane_pages: ``Q_r`` pages of each lane, page 0 included (C ints >= 1, checked by the caller);
            global page ids run over ``0 .. C * max(Q_r) - 1``.

    Attributes:
        cp_size: C. lane_pages: int64 ``[C]`` Q_r. pages_per_lane: ``max(Q_r)``. num_pages: ``C * max(Q_r)``.
        capacity_per_lane: int64 ``[C]`` usable pages (lane 0 loses page 0).
        free: int64 ``[C]`` free pages per lane, a read-only view of the live counts (copy it to keep it).
        changes: calls that took or gave back pages so far.
    """

    def __init__(self, lane_pages: Sequence[int]) -> None:
        caps = list(lane_pages)
        C = self.cp_size = len(caps)
        self.lane_pages = np.asarray(caps, dtype=_I64)  # [C] Q_r, page 0 included
        self.pages_per_lane = int(self.lane_pages.max())  # Q of the shared layout
        self.num_pages = C * self.pages_per_lane
        # One flat array of per-lane stacks of free page ids: lane r's stack is
        # ``_stack[_base[r] : _base[r] + _top[r]]``, its top at the end. Fresh: descending ids, so the lowest
        # come off first; lane 0 never holds page 0. E.g. C=2, Q=3: _stack [4, 2, 5, 3, 1], _base [0, 2].
        usable = np.asarray(caps, dtype=_I64) - (np.arange(C) == 0)  # [C] lane 0 loses page 0
        self._base = np.concatenate([[0], np.cumsum(usable)[:-1]]).astype(_I64)  # [C]
        self._stack = np.concatenate(
            [np.arange(q - 1, -1 if r else 0, -1, dtype=_I64) * C + r for r, q in enumerate(caps)]
        )
        self._top = usable.copy()  # [C] free pages
        self._make_views()
        # Bitmaps [num_pages + 1]: _usable, the page exists and is not page 0; _taken, it is handed out (a
        # checked page to free or extend is one lookup). The extra last entry (neither) is where clipped
        # out-of-range page ids land.
        ids = np.arange(self.num_pages, dtype=_I64)
        self._usable = np.append((ids // C < self.lane_pages[ids % C]) & (ids != 0), False)
        self._taken = np.zeros(self.num_pages + 1, dtype=bool)
        self.capacity_per_lane = self._top.copy()  # [C] usable pages
        self.changes = 0

    def _make_views(self) -> None:
        self.free = self._top.view()  # read-only, follows every change of _top (updated in place only)
        self.free.setflags(write=False)

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles carry the counts, not the view (a copied view would stop following them)."""
        state = self.__dict__.copy()
        del state["free"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._make_views()

    # ----------------------------------------------------------------------------------------- queries

    def is_held(self, pages: np.ndarray) -> np.ndarray:
        """Bool ``[n]``: whether each page is handed out; ids outside ``[0, num_pages)`` clip onto entries
        never held (page 0, or the spare one past the pool), so they read False."""
        return self._taken.take(pages, mode="clip")

    def is_free(self, pages: np.ndarray) -> np.ndarray:
        """Bool ``[n]``: whether each page id (int64, in ``[0, num_pages)``) exists and is free."""
        free: np.ndarray = self._usable[pages] > self._taken[pages]
        return free

    def holds(self, page: int) -> bool:
        """Whether page id ``page`` (a Python int, any value) is handed out; False outside ``[0, num_pages)``."""
        return 0 <= page < self.num_pages and bool(self._taken[page])

    def exists(self, page: int) -> bool:
        """Whether page id ``page`` (in ``[0, num_pages)``) exists on its lane and is not page 0."""
        return bool(self._usable[page])

    def lane_stack(self, r: int) -> np.ndarray:
        """Free page ids of lane r, bottom to top (a view)."""
        return self._stack[self._base[r] : self._base[r] + self._top[r]]

    def digest(self) -> str:
        """SHA-256 hex of the full free-list state; equal on every rank that replayed the same calls."""
        h = hashlib.sha256(self._top.tobytes())
        for r in range(self.cp_size):
            h.update((self.lane_stack(r) // self.cp_size).tobytes())  # local ids, as ever
        return h.hexdigest()

    def valid_last_locs(
        self, L0: np.ndarray, last: np.ndarray, P: int | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """``(last_locs + 1, page of each last_loc)``, int64 ``[B]`` each, when every ``last_loc`` is valid for
        its ``prefix_len`` (C-FAIL-FAST), else None (the caller then names the first bad request).

        Valid: ``last_loc = -1`` exactly where ``prefix_len = 0`` (the xor), else on a handed-out page (an id
        out of the pool clips onto page 0 or the spare last entry, never taken) with ``(last_loc + 1) % P ==
        prefix_len % P``. ``P``: the page size, an int or a 0-d int64 array."""
        nxt = last + 1
        page = last // P
        ok = (self._taken.take(page, mode="clip") | (nxt == 0)) & (nxt % P == L0 % P)
        if np.count_nonzero(ok) != L0.shape[0] or np.count_nonzero(np.logical_xor(L0, nxt)):
            return None
        return nxt, page

    def check_counts(self, counts: np.ndarray) -> None:
        """LaneExhausted for the first lane whose free pages are fewer than ``counts`` (int64 ``[C]``)."""
        short = (counts > self._top).nonzero()[0]
        if short.shape[0]:
            r = int(short[0])
            raise LaneExhausted(r, int(counts[r]), int(self._top[r]))

    def check_held(self, pages: np.ndarray, what: str = "cannot free") -> None:
        """AllocatorError (``"{what} page {p}: {why}"``) unless every page (int64 ``[n]``, ids in range) is
        handed out and listed once: not page 0, not free, not beyond its lane's capacity, no duplicate."""
        n = pages.shape[0]
        if (
            np.count_nonzero(self._taken[pages]) == n
        ):  # the common case: one lookup, then duplicates on a sorted copy
            if n < 2:
                return
            ordered = pages.copy()
            ordered.sort()  # np.sort without its Python wrapper
            if not np.count_nonzero(ordered[1:] == ordered[:-1]):
                return
        C = self.cp_size
        bad = pages[pages == 0]
        if bad.size:
            raise AllocatorError(f"{what} page 0: it is reserved for padding writes")
        bad = pages[~self._taken[pages]]
        if bad.size:
            p = int(bad[0])
            why = "it is already free (double free)" if self._usable[p] else f"beyond lane {p % C}'s capacity"
            raise AllocatorError(f"{what} page {p}: {why}")
        uniq, cnt = np.unique(pages, return_counts=True)
        if (cnt > 1).any():
            raise AllocatorError(f"{what} page {int(uniq[cnt > 1][0])}: listed more than once")

    # ------------------------------------------------------------------------------------ pick, commit
    def pick(self, run_owner: np.ndarray, run_pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pages for runs of one owner each, in run order, without taking them: ``(pages, counts)``,
        int64 ``[sum run_pages]`` and ``[C]``; ``commit`` takes them. LaneExhausted when a lane is short.

        Run j takes the next ``run_pages[j]`` pages off the top of lane ``run_owner[j]``'s stack, after the
        pages the earlier runs of that lane took. Work is O(runs + pages), independent of cp_size and pool.
        Example C=4, lane 3 stack [.., 19, 11, 7, 3] (top 3): runs (lane 3, 2 pages), (lane 3, 1 page)
        -> [3, 7, 11]; the stack's top is then 19.
        """
        counts = np.bincount(run_owner, weights=run_pages, minlength=self.cp_size).astype(_I64)  # [C]
        self.check_counts(counts)
        before = offsets_within_key(run_owner, run_pages, counts)  # pages earlier runs take from the lane
        top = self._base + self._top - 1  # [C] index of each lane's top page in _stack
        return self._stack[expand_runs(top[run_owner] - before, run_pages, step=-1)], counts

    def pick_cyclic(
        self, first_lanes: np.ndarray, num_pages: np.ndarray, lanes: np.ndarray, lane_pages: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``pick`` of one-page runs on cyclic lanes: request i takes ``num_pages[i]`` pages on lanes
        ``first_lanes[i], first_lanes[i] + 1, ...`` (mod C), in order (C-INTERLEAVE); ``(pages, counts)``.

        ``lanes``: int64 ``[sum num_pages]`` those lanes, flat; ``lane_pages``: int64 ``[B, C]`` each request's
        pages per lane. The same pages as ``pick`` of one run per page, without its sort: page k of request i
        comes ``prior[i, lane] + k // C`` pages below its lane's top, ``prior`` being the pages the earlier
        requests take on that lane. LaneExhausted when a lane is short. Example C=2, stacks with tops
        [4, 1]: one request from lane 1, 3 pages -> lanes 1, 0, 1 -> pages 1, 4, then the page under 1.
        """
        counts = lane_pages.sum(axis=0)
        self.check_counts(counts)
        C, B, N = self.cp_size, num_pages.shape[0], lanes.shape[0]
        top = self._base + self._top - 1  # [C] index of each lane's top page in _stack
        if B == 1:  # by doubling: the period of C lanes from first_lanes[0], each block one page lower
            idx = np.empty(N, dtype=_I64)
            k = min(N, C)
            idx[:k] = top[(int(first_lanes[0]) + np.arange(k, dtype=_I64)) % C]
            filled = k
            while filled < N:
                c = min(filled, N - filled)
                np.subtract(idx[:c], filled // C, out=idx[filled : filled + c])
                filled += c
            return self._stack[idx], counts
        first = np.zeros(B + 1, dtype=_I64)
        np.add.accumulate(num_pages, out=first[1:])
        req = np.repeat(np.arange(B, dtype=_I64), num_pages)
        k = np.arange(N, dtype=_I64) - first[req]
        prior = np.add.accumulate(lane_pages, axis=0) - lane_pages  # [B, C]
        idx = top[lanes] - prior.ravel()[req * C + lanes] - k // C
        return self._stack[idx], counts

    def pick_one_each(self, lanes: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """``pick`` of one page per lane listed (``lanes``: ints in ``[0, C)``), or None when a lane is short.
        Few pages: each lane's next pages off its stack, in order, in Python; the same pages as ``pick``."""
        k, C = len(lanes), self.cp_size
        if k > _SMALL:
            owners = np.array(lanes, dtype=_I64)
            if (np.bincount(owners, minlength=C) > self._top).any():
                return None
            return self.pick(owners, np.ones(k, dtype=_I64))
        top = (self._base + self._top).tolist()  # [C] one past each lane's top in _stack
        avail = self._top.tolist()
        taken, pos = [0] * C, []
        for f in lanes:
            taken[f] += 1
            if taken[f] > avail[f]:
                return None
            pos.append(top[f] - taken[f])
        return self._stack[pos], np.array(taken, dtype=_I64)

    def pick_few(self, run_owner: list[int], run_pages: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """``pick`` of a few runs given as Python lists (owner lanes in ``[0, C)``, pages >= 1 each), or None
        when a lane is short: each run's first page on its lane's stack found in Python, all pages in one
        expansion; the same pages as ``pick``. Example as ``pick``: runs [3, 3], pages [2, 1] -> [3, 7, 11]."""
        top = (self._base + self._top).tolist()  # [C] one past each lane's top in _stack
        avail = self._top.tolist()
        taken, start = [0] * self.cp_size, []
        for r, k in zip(run_owner, run_pages, strict=True):
            start.append(top[r] - 1 - taken[r])
            taken[r] += k
        if any(t > a for t, a in zip(taken, avail, strict=True)):
            return None
        idx = expand_runs(np.array(start, dtype=_I64), np.array(run_pages, dtype=_I64), step=-1)
        return self._stack[idx], np.array(taken, dtype=_I64)

    def commit(self, pages: np.ndarray, counts: np.ndarray) -> None:
        """Take the pages ``pick`` chose: pop ``counts[r]`` pages off every lane's stack."""
        self._top -= counts
        self._taken[pages] = True
        self.changes += 1

    def release(self, pages: np.ndarray) -> None:
        """Push checked, held ``pages`` (int64 ``[n]``, n >= 0; ``check_held``) back onto their lanes' stacks."""
        if pages.size == 0:
            return
        C = self.cp_size
        if pages.shape[0] == 1:  # one page (a request's last partial page): no sort
            p = int(pages[0])
            r = p % C
            self._stack[self._base[r] + self._top[r]] = p
            self._top[r] += 1
        elif C == 1:
            top = int(self._top[0])
            self._stack[top : top + pages.shape[0]] = pages[::-1]
            self._top[0] += pages.shape[0]
        else:  # each lane's pages go on its stack in reverse order (the first listed on top), all lanes at once
            lanes = pages % C
            order = np.argsort(lanes, kind="stable")  # by lane, listed order within a lane
            counts = np.bincount(lanes, minlength=C)  # [C]
            # page k of the sorted order, j-th of its lane r: _stack[_base[r] + _top[r] + counts[r] - 1 - j]
            # with j = k - (pages of lanes below r): one offset per lane, minus k.
            first = self._base + self._top - 1 + np.add.accumulate(counts)  # [C]
            self._stack[first[lanes[order]] - np.arange(pages.shape[0])] = pages[order]
            self._top += counts
        self._taken[pages] = False
        self.changes += 1
