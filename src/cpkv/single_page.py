"""Allocation without the extend planner when every request needs at most one new page (SPEC section 7).

Decode steps (``alloc_decode``: E = 1 per request) and small calls (a few short requests) take this path.
With at most one new page, C-ZIGZAG puts that page in segment 0, whose owner is the request's phase; so
the allocation needs only each new page's lane under the policy in force, which is
- ``rotation``: ``(prefix_len // P + req_index) % C`` (C-PHASE); ``legacy``: 0;
- ``balanced``: C-BALANCED for one page reduces to "the lane with the most free pages, ties to the first
  at or after the rotation phase, cyclically": placing one page on lane f leaves ``min_r free_r`` when
  lane f is not a least-free lane and one less otherwise (criterion 1), and ``sum_r n_r(f) free_r`` is
  ``free_f`` (criterion 2), so every most-free lane ties on both and criterion 3 picks among them.
A token then goes to ``last_loc + 1`` (head tokens, C-HEAD) or to ``page * P + offset`` of the new page.

The result's ``plan`` is built on first access by ``plan_batch`` with the head owners and (under
``balanced``) the phases the allocator used, exactly the call of the general path (C-BS1-COMPATIBILITY:
one planner), so plan fields, ``out_cache_loc``, ``new_pages`` and the allocator state are bit for bit
those of the general path (tests/unit/allocator/test_allocator_single_page.py checks that). Any input this
path does not take, valid or not, returns None: the general path then allocates or raises the typed error;
nothing has changed here. Its cost is a fixed few dozen numpy calls on ``[B]`` arrays, so scalars enter
them as 0-d arrays (a Python int operand costs numpy about a microsecond more per call).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from . import limits
from .allocation import ExtendAllocation
from .config import BALANCED
from .planner import plan_batch
from .policy import one_page_lanes, rotation_phase
from .slots import one_page_slots
from .validate import MAX_POSITION, int64_copy, plan_bytes_bound

if TYPE_CHECKING:
    from .allocator import OwnerLaneAllocator

_I64, _U64 = np.int64, np.uint64
_SMALL = 32  # up to this many new pages are placed in Python (cheaper than the vectorised _pick)
_EMPTY = np.zeros(0, dtype=_I64)
_EMPTY.setflags(write=False)
_ROWS = np.arange(1 << 12, dtype=_I64)  # row indices of _pages_repeat
_ROWS.setflags(write=False)


class SinglePageTables:
    """Per-allocator constants of the single-page path (built once by ``OwnerLaneAllocator``).

    Attributes:
        P, P_minus_1, one, zero: 0-d int64 arrays. slot_limit: 0-d uint64 ``num_pages * P`` (slots).
        max_prefix: 0-d uint64 ``MAX_POSITION - 1`` (the largest prefix_len that still takes one token).
        stamp: int64 ``[num_pages + 1]`` scratch of ``_pages_repeat`` (contents meaningless between calls).
    """

    def __init__(self, page_size: int, num_pages: int) -> None:
        self.P, self.P_minus_1 = np.array(page_size, dtype=_I64), np.array(page_size - 1, dtype=_I64)
        self.one, self.zero = np.array(1, dtype=_I64), np.array(0, dtype=_I64)
        self.slot_limit = np.array(num_pages * page_size, dtype=_U64)
        self.max_prefix = np.array(MAX_POSITION - 1, dtype=_U64)
        self.stamp = np.zeros(num_pages + 1, dtype=_I64)


def alloc_single_page(alloc: OwnerLaneAllocator, prefix_lens, extend_lens, last_locs) -> ExtendAllocation | None:
    """``alloc_extend`` for a batch whose requests each need at most one new page, or None (not taken).

    Args:
        alloc: the ``OwnerLaneAllocator`` to allocate from.
        prefix_lens: ``[B]`` tokens already cached per request (int64 numpy array, CPU tensor or list).
        extend_lens: ``[B]`` new tokens per request, each below ``2 * page_size``; None means 1 for every
            request (``alloc_decode``, which takes this path only when every ``prefix_len >= 1``).
        last_locs: ``[B]`` slot of position ``prefix_len - 1``, -1 when ``prefix_len == 0``.

    Returns:
        The ``ExtendAllocation`` the general path would return (its ``plan`` built on first access), or
        None when the batch is empty, a request needs two or more new pages, an input is not a 1-D int64
        array, CPU tensor or list of ints, or any input is invalid (the general path raises the error).
    """
    E = None
    if extend_lens is not None:  # a long request rules the path out first (bulk calls pay only this)
        E = int64_copy(extend_lens)
        if E is None or E.shape[0] == 0 or E.max() >= 2 * alloc.config.page_size:
            return None
    L0, last = int64_copy(prefix_lens), int64_copy(last_locs)
    if L0 is None or last is None or L0.shape[0] == 0 or last.shape != L0.shape:
        return None
    rows = _decode_rows(alloc, L0, last) if E is None else _extend_rows(alloc, L0, E, last)
    if rows is None:
        return None
    new_rows, nxt = rows
    if new_rows.shape[0]:
        lanes = one_page_lanes(L0, new_rows, alloc._top, alloc.config)
        picked = _pick(alloc, lanes)
        if picked is None:
            return None  # a lane is short: the general path raises LaneExhausted
        new_pages, counts = picked
    else:
        lanes, new_pages, counts = _EMPTY, _EMPTY, None
    out = one_page_slots(L0, E, nxt, new_rows, new_pages, alloc._single.P if E is None else alloc.config.page_size)
    out_cache_loc = alloc._on_device(out)
    if counts is not None:
        alloc._commit(new_pages, counts)  # only once out_cache_loc exists on the device (C-ATOMIC)
        new_pages.setflags(write=False)
    make_plan = partial(_plan, alloc.config, L0, E, last, new_rows, lanes)
    return ExtendAllocation(out_cache_loc, None, new_pages, make_plan=make_plan)


def _decode_rows(alloc: OwnerLaneAllocator, L0: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """E = 1: ``(rows that take a new page, last_locs + 1)``, or None. Valid here: ``1 <= L0 <=
    MAX_POSITION - 1``, ``last_loc`` on a held page with ``(last_loc + 1) % P == L0 % P`` (C-FAIL-FAST)."""
    t = alloc._single
    if _too_big(alloc, L0.shape[0], 1):
        return None
    lm1 = L0 - t.one
    page = last // t.P  # out-of-range ids clip onto entries never taken (page 0, or the one past the pool)
    off = last % t.P
    ok = (off == lm1 % t.P) & alloc._taken.take(page, mode="clip")
    ok &= lm1.view(_U64) < t.max_prefix
    if np.count_nonzero(ok) != L0.shape[0]:
        return None
    if _pages_repeat(t, page) and _shared_head_page(page[off != t.P_minus_1]):
        return None
    return (off == t.P_minus_1).nonzero()[0], last + t.one  # a page ends at last_loc: position L0 starts one


def _extend_rows(alloc, L0, E, last) -> tuple[np.ndarray, np.ndarray] | None:
    """E given (each below 2P): ``(rows that take a new page, last_locs + 1)``, or None (also when a request
    needs two pages). Valid: ``L0, E >= 0``, ``L0 + E <= MAX_POSITION``; ``last_loc = -1`` exactly when ``L0 == 0``,
    else on a held page with ``(last_loc + 1) % P == L0 % P`` (C-FAIL-FAST)."""
    t, P = alloc._single, alloc.config.page_size
    if E.shape != L0.shape or (L0 | E).min() < 0:
        return None
    if _too_big(alloc, L0.shape[0], int(E.max())):
        return None
    end = L0 + E  # a sum past int64 wraps negative: huge as uint64
    if end.view(_U64).max() > MAX_POSITION:
        return None
    valid = alloc._valid_last_locs(L0, last, t.P)  # the general path's check (it names the bad request)
    if valid is None:
        return None
    nxt, page = valid
    m = (end + (P - 1)) // P - (L0 + (P - 1)) // P  # [B] new pages
    if m.max() > 1:
        return None
    if _pages_repeat(t, page) and _shared_head_page(page[(nxt % t.P != t.zero) & (E > t.zero)]):
        return None
    return m.nonzero()[0], nxt


def _pages_repeat(t: SinglePageTables, page: np.ndarray) -> bool:
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


def _too_big(alloc: OwnerLaneAllocator, B: int, max_extend: int) -> bool:
    """Whether the plan (at most one new page per request) might exceed ``MAX_ARRAY_BYTES``; the general
    path then checks exactly and raises its PlanError."""
    return plan_bytes_bound(B, max_extend, 1, alloc.config.cp_size) > limits.MAX_ARRAY_BYTES


def _pick(alloc: OwnerLaneAllocator, lanes: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(pages, counts)`` as ``OwnerLaneAllocator._pick`` gives them for one page per run, or None when a
    lane is short. Few pages: each lane's next pages off its stack, in request order, in Python."""
    k, C = len(lanes), alloc.config.cp_size
    if k > _SMALL:
        owners = np.array(lanes, dtype=_I64)
        if (np.bincount(owners, minlength=C) > alloc._top).any():
            return None
        return alloc._pick(owners, np.ones(k, dtype=_I64))
    top = (alloc._base + alloc._top).tolist()  # [C] one past each lane's top in _stack
    avail = alloc._top.tolist()
    taken, pos = [0] * C, []
    for f in lanes:
        taken[f] += 1
        if taken[f] > avail[f]:
            return None
        pos.append(top[f] - taken[f])
    return alloc._stack[pos], np.array(taken, dtype=_I64)


def _plan(cfg, L0, E, last, new_rows, lanes):
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
