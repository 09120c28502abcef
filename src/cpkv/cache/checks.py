"""Input checks of the prefix cache: token ids, slots, lanes (SPEC section 8). Every failure is a
``PrefixCacheError`` naming the offending value; nothing is changed before a check passes."""

from __future__ import annotations

import numpy as np

from ..allocator import OwnerLaneAllocator
from ..config import check_lane as config_check_lane
from ..errors import PlanError, PrefixCacheError
from ..planner import _as_int_array

_I64 = np.int64


def int_array(name: str, values) -> np.ndarray:
    """``values`` (list, numpy or CPU tensor) as a contiguous 1-D int64 array, or PrefixCacheError."""
    if type(values) is np.ndarray and values.dtype == _I64 and values.ndim == 1:
        return np.ascontiguousarray(values)
    try:
        return np.ascontiguousarray(_as_int_array(name, values, None), dtype=_I64)
    except PlanError as e:
        raise PrefixCacheError(str(e)) from None


def check_lane(lane, cp_size: int) -> int:
    """``lane`` as an int in ``[0, cp_size)``, or PrefixCacheError."""
    return config_check_lane("lane", lane, cp_size, PrefixCacheError)


class Scratch:
    """A reusable int64 work buffer that grows as needed (one per cache, never shared between threads):
    a temporary as large as a prompt's slots costs page faults on every call when freshly allocated."""

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=_I64)

    def get(self, n: int) -> np.ndarray:
        """``[n]`` int64 of undefined contents, valid until the next ``get``."""
        if self._buf.shape[0] < n:
            self._buf = np.empty(max(n, 2 * self._buf.shape[0]), dtype=_I64)
        return self._buf[:n]


def whole_pages(slots: np.ndarray, page_size: int, allocator: OwnerLaneAllocator, scratch: Scratch) -> np.ndarray:
    """Page ids, int64 ``[k]``, of the slots ``[k * P]`` of k whole pages, checking that page i's slots
    are ``p*P + 0 .. P-1``, that the page exists and is held (not free, not page 0) and is listed once.

    Example P=4: slots ``[8, 9, 10, 11, 20, 21, 22, 23]`` -> pages ``[2, 5]``. The check subtracts each
    slot's offset in its page (``d``, which on whole pages repeats each page's first slot P times) and
    compares ``d`` with that repetition: three passes over the slots, no per-page loop.
    """
    P = page_size
    k = slots.shape[0] // P
    d = np.subtract(slots, _ramp(P, k * P), out=scratch.get(k * P))  # [k * P] whole pages: p*P, P times
    first = d[::P].copy()  # [k] first slot of each page
    if not (d.reshape(k, P) == first[:, None]).all() or (first % P).any():
        full = slots.reshape(k, P)
        i = int(np.flatnonzero((full != (full[:, :1] // P * P) + np.arange(P)).any(axis=1))[0])
        raise PrefixCacheError(f"slots of page {i} (tokens {i * P}..{i * P + P - 1}) are not one whole page: "
                               f"{full[i, :8].tolist()}...")  # fmt: skip
    pages = first // P
    if not pages.size:
        return pages
    if pages.min() <= 0 or pages.max() >= allocator.num_pages:
        bad = pages[(pages <= 0) | (pages >= allocator.num_pages)]
        raise PrefixCacheError(f"page {int(bad[0])} cannot be cached (page 0 or out of range)")
    C, lane_pages = allocator.config.cp_size, allocator.lane_pages
    if lane_pages.min() != lane_pages.max():  # unequal lanes: an id below C * max(Q) may not exist
        bad = pages[pages // C >= lane_pages[pages % C]]
        if bad.size:
            p = int(bad[0])
            raise PrefixCacheError(f"page {p} does not exist: lane {p % C} holds {int(lane_pages[p % C])} pages")
    free = allocator.is_free(pages)
    if free.any():
        raise PrefixCacheError(f"page {int(pages[free][0])} is free in the allocator: insert only pages you hold")
    ordered = np.sort(pages)
    twice = ordered[1:] == ordered[:-1]
    if twice.any():
        raise PrefixCacheError(f"page {int(ordered[1:][twice][0])} is listed more than once")
    return pages


_RAMPS: dict[int, np.ndarray] = {}


def _ramp(page_size: int, n: int) -> np.ndarray:
    """``[n]`` int64 offsets in page, ``0, 1, .., P-1, 0, 1, ..`` (a read-only view of a cached array)."""
    ramp = _RAMPS.get(page_size)
    if ramp is None or ramp.shape[0] < n:
        ramp = np.tile(np.arange(page_size, dtype=_I64), max(n, 1 << 16) // page_size + 1)
        ramp.setflags(write=False)
        _RAMPS[page_size] = ramp
    return ramp[:n]
