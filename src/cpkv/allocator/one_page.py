"""The one-page path: allocation without the extend planner when every request takes at most one new page.

Decode steps (``alloc_decode``: E = 1 per request) and small calls (a few short requests) take it. With at
most one new page, C-ZIGZAG puts that page in segment 0 and C-INTERLEAVE on lane ``phase + 0``: under either
CP strategy its owner is the request's phase, so the
allocation needs only each new page's lane under the policy in force (``policy.one_page_lanes``), its page
off that lane (``LanePool.pick_one_each``) and the slots (``slots.one_page_slots``): head tokens at
``last_loc + 1 ...`` (C-HEAD), the rest at ``page * P + offset`` of the new page.

``pick_one_page`` reads the pool through its public calls only and takes nothing: the allocator commits
the pages once ``out_cache_loc`` exists on its device (C-ATOMIC). The result's ``plan`` is built on first
access by ``plan_batch`` with the head owners and (under ``balanced``) the phases used, the very call of
the general path (C-BS1-COMPATIBILITY), so plan fields, ``out_cache_loc``, ``new_pages`` and the pool are
bit for bit those of the general path (tests/unit/allocator/test_allocator_one_page.py). Any input this
path does not take, valid or not, gives None and changes nothing: the general path then allocates or
raises the typed error. Scalars enter numpy as 0-d arrays (``OnePageTables``; benchmarks/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from .. import limits
from ..config import BALANCED, CPConfig
from ..plan import BatchPlan
from ..planner import plan_batch
from ..policy import one_page_lanes, rotation_phase
from ..slots import one_page_slots
from ..validate import MAX_POSITION, int64_copy, plan_bytes_bound
from .pool import LanePool

_I64, _U64 = np.int64, np.uint64
_EMPTY = np.zeros(0, dtype=_I64)
_EMPTY.setflags(write=False)
_ROWS = np.arange(1 << 12, dtype=_I64)  # row indices of _pages_repeat
_ROWS.setflags(write=False)


class OnePageTables:
    """Per-allocator constants of the one-page path (built once by ``OwnerLaneAllocator``).

    Attributes:
        P, P_minus_1, one, zero: 0-d int64 arrays.
        max_prefix: 0-d uint64 ``MAX_POSITION - 1`` (the largest prefix_len that still takes one token).
        stamp: int64 ``[num_pages + 1]`` scratch of ``_pages_repeat`` (contents meaningless between calls).
    """

    def __init__(self, page_size: int, num_pages: int) -> None:
        self.P, self.P_minus_1 = np.array(page_size, dtype=_I64), np.array(page_size - 1, dtype=_I64)
        self.one, self.zero = np.array(1, dtype=_I64), np.array(0, dtype=_I64)
        self.max_prefix = np.array(MAX_POSITION - 1, dtype=_U64)
        self.stamp = np.zeros(num_pages + 1, dtype=_I64)


OnePage = tuple[np.ndarray, np.ndarray, "np.ndarray | None", Callable[[], BatchPlan]]
"""What ``pick_one_page`` chose, nothing taken yet: ``(slots, new_pages, counts, make_plan)``: ``[sum E]``
int64 numpy ``out_cache_loc`` on the host; ``[k]`` int64 pages picked, request order; int64 ``[C]`` of them
per lane for ``LanePool.commit`` (None when no request takes a page); the builder of the call's
``BatchPlan`` (``ExtendAllocation``'s ``make_plan``). A plain tuple: this runs once per decode step."""


def pick_one_page(
    pool: LanePool,
    tables: OnePageTables,
    config: CPConfig,
    prefix_lens: object,
    extend_lens: object,
    last_locs: object,
) -> OnePage | None:
    """``alloc_extend``'s pages and slots for a batch whose requests each take at most one new page, or None
    (not taken). Picks, never commits.

    Args:
        pool: the allocator's ``LanePool``. tables: its ``OnePageTables``. config: its ``CPConfig``.
        prefix_lens: ``[B]`` tokens already cached per request (int64 numpy array, CPU tensor or list).
        extend_lens: ``[B]`` new tokens per request, each below ``2 * page_size``; None means 1 for every
            request (``alloc_decode``, which takes this path only when every ``prefix_len >= 1``).
        last_locs: ``[B]`` slot of position ``prefix_len - 1``, -1 when ``prefix_len == 0``.

    Returns:
        ``OnePage`` ``(slots, new_pages, counts, make_plan)`` with what the general path would allocate, or None when the batch is empty, a request
        needs two or more new pages, an input is not a 1-D int64 array, CPU tensor or list of ints, a lane
        is short, or any input is invalid (the general path raises the error).
    """
    E = None
    if extend_lens is not None:  # a long request rules the path out first (bulk calls pay only this)
        E = int64_copy(extend_lens)
        if E is None or E.shape[0] == 0 or E.max() >= 2 * config.page_size:
            return None
    L0, last = int64_copy(prefix_lens), int64_copy(last_locs)
    if L0 is None or last is None or L0.shape[0] == 0 or last.shape != L0.shape:
        return None
    rows = (
        _decode_rows(pool, tables, config, L0, last)
        if E is None
        else _extend_rows(pool, tables, config, L0, E, last)
    )
    if rows is None:
        return None
    new_rows, nxt = rows
    lanes: list[int] | np.ndarray
    if new_rows.shape[0]:
        lanes = one_page_lanes(L0, E, new_rows, pool.free, config)
        picked = pool.pick_one_each(lanes)
        if picked is None:
            return None  # a lane is short: the general path raises LaneExhausted
        new_pages, counts = picked
    else:
        lanes, new_pages, counts = _EMPTY, _EMPTY, None
    slots = one_page_slots(L0, E, nxt, new_rows, new_pages, tables.P if E is None else config.page_size)
    return slots, new_pages, counts, partial(_plan, config, L0, E, last, new_rows, lanes)


def _decode_rows(
    pool: LanePool, t: OnePageTables, config: CPConfig, L0: np.ndarray, last: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """E = 1: ``(rows that take a new page, last_locs + 1)``, or None. Valid here: ``1 <= L0 <=
    MAX_POSITION - 1``, ``last_loc`` on a held page with ``(last_loc + 1) % P == L0 % P`` (C-FAIL-FAST)."""
    if _too_big(config, L0.shape[0], 1):
        return None
    lm1 = L0 - t.one
    page = last // t.P  # out-of-range ids clip onto entries never held (page 0, or the one past the pool)
    off = last % t.P
    ok = (off == lm1 % t.P) & pool.is_held(page)
    ok &= lm1.view(_U64) < t.max_prefix
    if np.count_nonzero(ok) != L0.shape[0]:
        return None
    if _pages_repeat(t, page) and _shared_head_page(page[off != t.P_minus_1]):
        return None
    return (off == t.P_minus_1).nonzero()[0], last + t.one  # a page ends at last_loc: position L0 starts one


def _extend_rows(
    pool: LanePool, t: OnePageTables, config: CPConfig, L0: np.ndarray, E: np.ndarray, last: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """E given (each below 2P): ``(rows that take a new page, last_locs + 1)``, or None (also when a request
    needs two pages). Valid: ``L0, E >= 0``, ``L0 + E <= MAX_POSITION``; ``last_loc = -1`` exactly when ``L0 == 0``,
    else on a held page with ``(last_loc + 1) % P == L0 % P`` (C-FAIL-FAST)."""
    P = config.page_size
    if E.shape != L0.shape or (L0 | E).min() < 0:
        return None
    if _too_big(config, L0.shape[0], int(E.max())):
        return None
    end = L0 + E  # a sum past int64 wraps negative: huge as uint64
    if end.view(_U64).max() > MAX_POSITION:
        return None
    valid = pool.valid_last_locs(L0, last, t.P)  # the general path's check (it names the bad request)
    if valid is None:
        return None
    nxt, page = valid
    m = (end + (P - 1)) // P - (L0 + (P - 1)) // P  # [B] new pages
    if m.max() > 1:
        return None
    if _pages_repeat(t, page) and _shared_head_page(page[(nxt % t.P != t.zero) & (E > t.zero)]):
        return None
    return m.nonzero()[0], nxt


def _pages_repeat(t: OnePageTables, page: np.ndarray) -> bool:
    """Whether any page id occurs twice in ``page`` (int64 ``[B]``, ids in ``[-1, num_pages)``; -1 wraps to
    the spare last entry). Each row stamps its index at its page and reads it back: a repeated page keeps
    one row's index, so another row reads a different one. Three passes over B, no sort."""
    B = page.shape[0]
    rows = _ROWS[:B] if B <= _ROWS.shape[0] else np.arange(B, dtype=_I64)
    t.stamp[page] = rows
    return bool(np.count_nonzero(t.stamp[page] != rows))


def _shared_head_page(pages: np.ndarray) -> bool:
    """Whether two requests would write head tokens into one page (the general path raises); run only
    when some page repeats (requests sharing whole prefix pages are fine)."""
    pages = np.sort(pages)
    return bool((pages[1:] == pages[:-1]).any())


def _too_big(config: CPConfig, B: int, max_extend: int) -> bool:
    """Whether the plan (at most one new page per request) might exceed ``MAX_ARRAY_BYTES``; the general
    path then checks exactly and raises its PlanError."""
    return plan_bytes_bound(B, max_extend, 1, config.cp_size) > limits.MAX_ARRAY_BYTES


def _plan(
    cfg: CPConfig,
    L0: np.ndarray,
    E: np.ndarray | None,
    last: np.ndarray,
    new_rows: np.ndarray,
    lanes: list[int] | np.ndarray,
) -> BatchPlan:
    """The general path's ``plan_batch`` call (E None: decode, 1 per request): head owners from
    ``last_locs``; under ``balanced`` the phases (rotation where no page is new, the chosen lanes)."""
    C, P = cfg.cp_size, cfg.page_size
    E = np.ones_like(L0) if E is None else E
    head = np.where(L0 > 0, (last // P) % C, -1)
    phases = None
    if cfg.owner_policy == BALANCED:
        phases = rotation_phase(L0, np.arange(L0.shape[0], dtype=_I64), P, C)
        phases[new_rows] = lanes
    return plan_batch(L0, E, cfg, head_owners=head, phases=phases)
