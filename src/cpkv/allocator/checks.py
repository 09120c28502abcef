"""Input checks of the allocator's calls: page ids, lanes, ``last_locs``, draft lengths (SPEC C-FAIL-FAST, C-HEAD,
C-DRAFT).

Every failure is an ``AllocatorError`` naming the request and the offending value; nothing is taken or
freed before a check passes. The common valid case costs one vectorised test (``LanePool.valid_last_locs``);
only a failing batch is searched for the first bad request.
"""

from __future__ import annotations

import numpy as np

from ..config import CPConfig
from ..errors import AllocatorError, ConfigError
from ..limits import check_bytes
from ..validate import MAX_POSITION, as_int_array, check_int
from .pool import LanePool

_U64 = np.uint64
_MAX = np.maximum.reduce  # ndarray.max without its Python wrapper
_I64 = np.int64
_FEW = 8  # batches of at most this many requests have their last_locs checked with Python ints


def check_pool_size(cp_size: int, pages_per_lane: int, page_size: int) -> None:
    """ConfigError for a pool of ``cp_size`` lanes of up to ``pages_per_lane`` pages of ``page_size`` tokens
    whose slots (``page * P + offset``) pass ``MAX_POSITION`` (2**53: slots stay exact in int64 and
    float64), or whose page tables (at most 32 B per page while built) pass ``cpkv.limits.MAX_ARRAY_BYTES``."""
    num_pages = cp_size * pages_per_lane
    if num_pages * page_size > MAX_POSITION:
        raise ConfigError(
            f"a pool of {num_pages:,} pages of page_size={page_size} has more than {MAX_POSITION} "
            f"(2**53) slots, the most cpkv addresses; lower pages_per_lane or page_size"
        )
    check_bytes(
        f"an allocator of {num_pages:,} pages ({cp_size} lanes of up to {pages_per_lane:,})",
        32 * num_pages,
        ConfigError,
        "lower pages_per_lane",
    )


def page_id_array(pages: object, num_pages: int) -> np.ndarray:
    """``pages`` (list, numpy or CPU tensor) as int64 ``[n]`` ids in ``[0, num_pages)``, else AllocatorError."""
    arr = as_int_array("pages", pages, error=AllocatorError)
    if arr.shape[0] and _MAX(arr.view(_U64)) >= num_pages:  # a negative id wraps to a huge one
        bad = arr[(arr < 0) | (arr >= num_pages)]
        raise AllocatorError(f"page id {int(bad[0])} out of range [0, {num_pages})")
    return arr


def lane_array(owners: object, cp_size: int) -> np.ndarray:
    """``owners`` (list, numpy or CPU tensor) as int64 ``[n]`` lanes in ``[0, cp_size)``, else AllocatorError."""
    arr = as_int_array("owners", owners, error=AllocatorError)
    bad = np.flatnonzero((arr < 0) | (arr >= cp_size))
    if bad.size:
        i = int(bad[0])
        raise AllocatorError(f"owners[{i}]={int(arr[i])} out of range [0, {cp_size})")
    return arr


def draft_lengths(seq_lens: object, num_draft_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``(prefix_lens, extend_lens)`` of ``alloc_draft``: ``seq_lens`` as int64 ``[B]`` and ``[k] * B`` (C-DRAFT),
    else AllocatorError naming ``num_draft_tokens`` (not an int >= 1). Example ``([5, 9], 3)`` -> ``([5, 9], [3, 3])``."""
    k = check_int("num_draft_tokens", num_draft_tokens, 1, error=AllocatorError)
    L0 = as_int_array("seq_lens", seq_lens)
    return L0, np.full_like(L0, k)


def head_owners(pool: LanePool, config: CPConfig, L0: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Validate ``last_locs`` against ``prefix_lens`` (int64 ``[B]`` each; C-FAIL-FAST) and return the lane
    of each ``last_loc``'s page, int64 ``[B]`` (-1: no prefix), else AllocatorError naming the request.

    Valid: ``last_loc = -1`` exactly when ``prefix_len = 0``, else a slot of a page the pool holds, in
    ``[P, num_pages * P)``, with ``(last_loc + 1) % P == prefix_len % P``.
    """
    P, C, num_pages = config.page_size, config.cp_size, pool.num_pages
    if L0.shape[0] <= _FEW:  # a few requests: Python ints cost less than the vectorised test's numpy calls
        heads = []
        for l0, x in zip(L0.tolist(), last.tolist(), strict=True):
            if x == -1 and l0 == 0:
                heads.append(-1)
            elif l0 > 0 and (x + 1) % P == l0 % P and pool.holds(x // P):
                heads.append(x // P % C)
            else:
                break  # invalid: the checks below name it
        else:
            return np.array(heads, dtype=_I64)
    valid = pool.valid_last_locs(L0, last, P)
    if valid is not None:
        nxt, page = valid
        return np.where(nxt != 0, page % C, -1)
    none = L0 <= 0
    has = ~none
    bad = np.flatnonzero(none & (last != -1))
    if bad.size:
        i = int(bad[0])
        raise AllocatorError(f"request {i}: prefix_len={int(L0[i])} needs last_loc=-1, got {int(last[i])}")
    bad = np.flatnonzero(has & ((last < P) | (last >= num_pages * P)))
    if bad.size:
        i = int(bad[0])
        raise AllocatorError(
            f"request {i}: last_loc={int(last[i])} out of range [{P}, {num_pages * P}) "
            f"for prefix_len={int(L0[i])}"
        )
    bad = np.flatnonzero(has & ((last + 1) % P != L0 % P))
    if bad.size:
        i = int(bad[0])
        raise AllocatorError(
            f"request {i}: last_loc={int(last[i])} is inconsistent with prefix_len={int(L0[i])}: "
            f"(last_loc + 1) % {P} = {(int(last[i]) + 1) % P} but prefix_len % {P} = {int(L0[i]) % P}"
        )
    page = np.where(has, last // P, 0)
    bad = np.flatnonzero(has & ~pool.is_held(page))
    if bad.size:
        i = int(bad[0])
        p = int(page[i])
        why = (
            "is free"
            if pool.exists(p)
            else f"does not exist (lane {p % C} holds {pool.lane_pages[p % C]} pages)"
        )
        raise AllocatorError(f"request {i}: last_loc={int(last[i])} lies on page {p}, which {why}")
    return np.where(has, page % C, -1)


def check_shared_heads(L0: np.ndarray, E: np.ndarray, last: np.ndarray, P: int) -> None:
    """AllocatorError when two requests of a batch would write head tokens into the same page (C-HEAD):
    both ``last_loc`` on one partly filled page (``prefix_len % P != 0``) and both extending, so their
    tokens would take the same slots. A page holds one sequence's next tokens; a scheduler that shares a
    partly filled prefix page copies it first (requests that share whole pages are fine).
    Example P=4: ``alloc_extend([6, 6], [1, 1], [9, 9])`` would give both requests slot 10."""
    rows = ((L0 % P != 0) & (E > 0)).nonzero()[0]
    if rows.shape[0] < 2:
        return
    page = last[rows] // P
    order = np.argsort(page, kind="stable")
    same = np.flatnonzero(page[order][1:] == page[order][:-1])
    if same.size:
        i, j = sorted((int(rows[order[same[0]]]), int(rows[order[same[0] + 1]])))
        raise AllocatorError(
            f"requests {i} and {j}: last_loc={int(last[i])} and last_loc={int(last[j])} lie on page "
            f"{int(last[i]) // P}, partly filled, and both extend it: their head tokens would take the same "
            f"slots (copy a shared partly filled page before extending it)"
        )
