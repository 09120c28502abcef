"""Input checks of the prefix cache: token ids, slots, lanes (SPEC section 8). Every failure is a
``PrefixCacheError`` naming the offending value; nothing is changed before a check passes."""

from __future__ import annotations

import numpy as np

from ..allocator import OwnerLaneAllocator
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
    if isinstance(lane, bool) or not hasattr(lane, "__index__") or not 0 <= int(lane) < cp_size:
        raise PrefixCacheError(f"lane={lane!r} out of range [0, {cp_size})")
    return int(lane)


def whole_pages(full: np.ndarray, allocator: OwnerLaneAllocator) -> np.ndarray:
    """Page ids, int64 ``[k]``, of ``[k, P]`` slot rows, checking that each row is one whole page
    (``p*P + 0 .. P-1``), that the page exists and is held (not free, not page 0) and is listed once."""
    P = full.shape[1]
    pages = full[:, 0] // P
    whole = (pages * P)[:, None] + np.arange(P, dtype=_I64)  # [k, P] the slots of whole pages
    if not np.array_equal(full, whole):
        i = int(np.flatnonzero((full != whole).any(axis=1))[0])
        raise PrefixCacheError(f"slots of page {i} (tokens {i * P}..{i * P + P - 1}) are not one whole page: "
                               f"{full[i, :8].tolist()}...")  # fmt: skip
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
    bad = pages[allocator.is_free(pages)]
    if bad.size:
        raise PrefixCacheError(f"page {int(bad[0])} is free in the allocator: insert only pages you hold")
    ordered = np.sort(pages)
    twice = ordered[1:][ordered[1:] == ordered[:-1]]
    if twice.size:
        raise PrefixCacheError(f"page {int(twice[0])} is listed more than once")
    return pages
