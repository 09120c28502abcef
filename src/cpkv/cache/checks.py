"""Input checks of the prefix cache: token ids, slots, lanes (SPEC section 8). Every failure is a
``PrefixCacheError`` naming the offending value; nothing is changed before a check passes."""

from __future__ import annotations

import numpy as np

from ..allocator import OwnerLaneAllocator
from ..errors import PrefixCacheError
from ..validate import as_int_array
from ..validate import check_lane as validate_check_lane

_I64 = np.int64
_MAX, _MIN = np.maximum.reduce, np.minimum.reduce  # the reductions without ndarray.max's Python wrapper


def int_array(name: str, values) -> np.ndarray:
    """``values`` (list, numpy or CPU tensor) as a contiguous 1-D int64 array, or PrefixCacheError."""
    if type(values) is np.ndarray and values.dtype == _I64 and values.ndim == 1:
        return np.ascontiguousarray(values)
    return np.ascontiguousarray(as_int_array(name, values, error=PrefixCacheError), dtype=_I64)


def check_lane(lane, cp_size: int) -> int:
    """``lane`` as an int in ``[0, cp_size)``, or PrefixCacheError."""
    return validate_check_lane("lane", lane, cp_size, PrefixCacheError)


class PageChecker:
    """The page checks of ``PrefixCache.insert`` against one allocator, with reusable work buffers (one per
    cache, never shared between threads: a temporary as large as a prompt's slots costs page faults on
    every call when freshly allocated).

    Args:
        allocator: the cache's ``OwnerLaneAllocator`` (page size, page range and lane capacities are read
            once; which pages are free is asked on every call).
    """

    def __init__(self, allocator: OwnerLaneAllocator) -> None:
        self.allocator = allocator
        self.page_size = allocator.config.page_size
        self.cp_size = allocator.config.cp_size
        self.num_pages = allocator.num_pages
        lane_pages = allocator.lane_pages
        self._lane_pages = None if lane_pages.min() == lane_pages.max() else lane_pages.copy()  # [C] unequal
        self._ints = np.empty((0, self.page_size), dtype=_I64)  # [rows, P] slots of whole pages
        self._bools = np.empty((0, self.page_size), dtype=bool)  # [rows, P] mismatch
        self._ramp = np.empty((0, self.page_size), dtype=_I64)  # [rows, P] offsets in page, read-only

    def whole_pages(self, slots: np.ndarray, *, allocator_rows: bool = False) -> np.ndarray:
        """Page ids, int64 ``[k]``, of the slots (int64 ``[k * P]``, contiguous) of k whole pages, checking
        that page i's slots are ``p*P + 0 .. P-1``, that the page exists and is held (not free, not page
        0) and that it is listed once; else PrefixCacheError naming the first offending page.

        Example P=4: slots ``[8, 9, 10, 11, 20, 21, 22, 23]`` -> pages ``[2, 5]``. Page i is whole when its
        slots equal ``p*P + 0 .. P-1`` with ``p = slots[i*P] // P`` (for the first slot: ``slots[i*P] % P
        == 0``); those rows are built in a reused buffer and compared with the slots at once.
        ``allocator_rows``: the slots are a row as the allocator wrote it (``RequestFlow``): only each page's
        first and last slot are compared, O(k) in place of O(k * P); the other checks are the same.
        """
        P = self.page_size
        k = slots.shape[0] // P
        full = slots.reshape(k, P)
        pages = full[:, 0] // P  # [k]
        if allocator_rows:  # page i's first slot is p*P, its last p*P + P-1
            first = full[:, 0]
            broken = np.count_nonzero(first % P) + np.count_nonzero(full[:, P - 1] - first - (P - 1))
        else:
            ramp = self._buffers(k)
            whole = np.add(ramp, (pages * P)[:, None], out=self._ints[:k])  # [k, P] p*P + 0 .. P-1
            broken = np.count_nonzero(np.not_equal(whole, full, out=self._bools[:k]))
        if broken:
            i = int(np.flatnonzero((full != (full[:, :1] // P * P) + np.arange(P)).any(axis=1))[0])
            raise PrefixCacheError(
                f"slots of page {i} (tokens {i * P}..{i * P + P - 1}) are not one whole page: "
                f"{full[i, :8].tolist()}..."
            )
        if not k:
            return pages
        if _MAX(pages) >= self.num_pages or _MIN(pages) <= 0:
            bad = pages[(pages <= 0) | (pages >= self.num_pages)]
            raise PrefixCacheError(f"page {int(bad[0])} cannot be cached (page 0 or out of range)")
        C, lane_pages = self.cp_size, self._lane_pages
        if lane_pages is not None:  # unequal lanes: an id below C * max(Q) may not exist
            bad = pages[pages // C >= lane_pages[pages % C]]
            if bad.size:
                p = int(bad[0])
                raise PrefixCacheError(
                    f"page {p} does not exist: lane {p % C} holds {int(lane_pages[p % C])} pages"
                )
        free = self.allocator.pool.is_free(pages)  # ids checked in range above
        if np.count_nonzero(free):
            raise PrefixCacheError(
                f"page {int(pages[free][0])} is free in the allocator: insert only pages you hold"
            )
        ordered = pages.copy()
        ordered.sort()  # np.sort without its Python wrapper
        twice = ordered[1:] == ordered[:-1]
        if np.count_nonzero(twice):
            raise PrefixCacheError(f"page {int(ordered[1:][twice][0])} is listed more than once")
        return pages

    def _buffers(self, k: int) -> np.ndarray:
        """Grow the work buffers to at least ``k`` rows; returns the ramp ``[k, P]`` (0 .. P-1 in each row)."""
        if self._ramp.shape[0] < k:
            rows = max(k, 2 * self._ramp.shape[0], 64)
            self._ints = np.empty((rows, self.page_size), dtype=_I64)
            self._bools = np.empty((rows, self.page_size), dtype=bool)
            self._ramp = np.broadcast_to(np.arange(self.page_size, dtype=_I64), (rows, self.page_size)).copy()
            self._ramp.setflags(write=False)
        return self._ramp[:k]
