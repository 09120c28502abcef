"""The page-aligned path: allocation of a small batch whose prefixes all end on a page boundary.

SGLang's calls are mostly of this shape: new prompts (``prefix_len`` 0), chains continued from whole cached
pages (its sharded allocator extends nothing else) and chunked prefill. With ``prefix_len % P == 0`` no request
has head tokens (C-HEAD), so a request's ``m = ceil(E / P)`` new pages are its C-ZIGZAG segments alone: segment
s of 2C holds ``m // 2C`` pages, one more for ``s < m % 2C``, on lane ``(z_s + phase) % C`` (under C-INTERLEAVE
page j is on lane ``(phase + j) % C``, a batch of at most ``_FEW`` new pages). For a few requests
(at most ``MAX_REQUESTS``) that is cheaper in Python integers than in numpy calls: lengths, ``last_locs``,
phases (``policy.balanced_phase``, the one rule) and runs are worked out per request, the pages picked in one
``LanePool`` call and the slots written in one pass; the plan is deferred, built on first access by
``plan_arrays`` with the phases used, the general path's own call (C-BS1-COMPATIBILITY), so
``out_cache_loc``, ``new_pages``, the plan and the pool are bit for bit the general path's
(tests/unit/allocator/test_allocator_aligned.py).

``pick_aligned`` takes nothing: the allocator commits once ``out_cache_loc`` exists (C-ATOMIC). Any input it
does not take, valid or not, gives None and changes nothing; the other paths then allocate or raise.
"""

from __future__ import annotations

import sys
from functools import partial
from itertools import accumulate
from typing import Any

import numpy as np

from .. import limits
from ..config import BALANCED, INTERLEAVE, LEGACY, CPConfig
from ..errors import LaneExhausted
from ..plan import BatchPlan
from ..planner import plan_arrays
from ..policy import balanced_phase
from ..runs import RAMP
from ..validate import MAX_POSITION, plan_bytes_bound
from .one_page import OnePage
from .pool import LanePool

_I64 = np.int64
_NO_PAGES = np.zeros(0, dtype=_I64)
_NO_PAGES.setflags(write=False)
MAX_REQUESTS = 16  # batches up to this many requests take the path (Python work: O(B * C))
_ONE_EACH = 32  # up to this many one-page runs are picked by LanePool.pick_one_each
_FEW = 512  # up to this many runs by LanePool.pick_few (Python), more by LanePool.pick


def pick_aligned(
    pool: LanePool, config: CPConfig, prefix_lens: object, extend_lens: object, last_locs: object
) -> OnePage | None:
    """``alloc_extend``'s slots and pages for a batch of 1..``MAX_REQUESTS`` requests, each with
    ``prefix_len % P == 0``, under C-ZIGZAG or C-INTERLEAVE; None when the path does not take the call. Picks, never commits.

    Args:
        pool: the allocator's ``LanePool``. config: its ``CPConfig``.
        prefix_lens, extend_lens, last_locs: ``[B]`` as for ``alloc_extend`` (int64 numpy arrays, int64 CPU
            tensors or lists of ints).

    Returns:
        ``OnePage`` ``(slots, new_pages, counts, make_plan)`` (``counts`` None when no page is new), what the
        general path would allocate; None for more than ``MAX_REQUESTS`` requests (under C-INTERLEAVE more than
        ``_FEW`` new pages), another
        input type, a prefix off a page boundary, a plan near ``cpkv.limits.MAX_ARRAY_BYTES``, a short lane
        or any invalid input (the general path then raises its typed error). Example C=8, P=64, fresh pool,
        balanced, one 64-token prompt: lane 1 (the freest, lane 0 lacks page 0), page 9, slots 576..639.
    """
    B = _length(prefix_lens)
    if not 0 < B <= MAX_REQUESTS:
        return None
    l0, e, last = _ints(prefix_lens, B), _ints(extend_lens, B), _ints(last_locs, B)
    if l0 is None or e is None or last is None:
        return None
    rows = _runs(pool, config, l0, e, last)
    if rows is None:
        return None
    phases, owners, pages, m_max, one_each = rows
    if plan_bytes_bound(B, max(e), m_max, config.cp_size) > limits.MAX_ARRAY_BYTES:
        return None  # the general path checks exactly and raises its PlanError
    if owners:
        if one_each:
            picked = pool.pick_one_each(owners)
        elif len(owners) <= _FEW:
            picked = pool.pick_few(owners, pages)
        else:
            try:
                picked = pool.pick(np.array(owners, dtype=_I64), np.array(pages, dtype=_I64))
            except LaneExhausted:
                picked = None
        if picked is None:
            return None  # a lane is short: the general path raises LaneExhausted
        new_pages, counts = picked
    else:
        new_pages, counts = _NO_PAGES, None
    return _slots(new_pages, e, config.page_size), new_pages, counts, partial(_plan, config, l0, e, phases)


def _plan(config: CPConfig, l0: list[int], e: list[int], phases: list[int]) -> BatchPlan:
    """The general path's ``plan_arrays`` call for the batch: no head owner (no head tokens, C-HEAD); under
    ``balanced`` the phases used, else the policy's own (rotation or legacy, as ``plan_arrays`` derives them)."""
    phase_arr = np.array(phases, dtype=_I64) if config.owner_policy == BALANCED else None
    head = np.full(len(l0), -1, dtype=_I64)
    L0, E = np.array(l0, dtype=_I64), np.array(e, dtype=_I64)
    return plan_arrays(L0, E, config, head_owners=head, phases=phase_arr, lanes_valid=True)


def _length(values: object) -> int:
    """Entries of a 1-D array, tensor or list (what the path may take), else -1: a cheap look before any copy."""
    shape = getattr(values, "shape", None)
    if shape is not None:
        return shape[0] if len(shape) == 1 else -1
    return len(values) if type(values) is list else -1


def _ints(values: Any, n: int) -> list[int] | None:
    """``values`` as a new list of ``n`` Python ints when they are an int64 1-D numpy array, an int64 CPU
    tensor without grad or a list of Python ints (bools excluded); None for anything else."""
    if type(values) is np.ndarray:
        ok = values.dtype == _I64 and values.ndim == 1
    elif (torch := sys.modules.get("torch")) is not None and type(values) is torch.Tensor:
        ok = values.dtype == torch.int64 and values.ndim == 1 and values.is_cpu and not values.requires_grad
    elif type(values) is list:
        return list(values) if len(values) == n and all(type(v) is int for v in values) else None
    else:
        return None
    return values.tolist() if ok and values.shape[0] == n else None


def _runs(
    pool: LanePool, config: CPConfig, l0: list[int], e: list[int], last: list[int]
) -> tuple[list[int], list[int], list[int], int, bool] | None:
    """Per request: check it (``L0, E >= 0``, ``L0 % P == 0``, ``L0 + E <= MAX_POSITION``, ``last_loc`` -1
    exactly when ``L0 == 0``, else the last slot of a held page), pick its phase (the policy's; ``balanced``
    sees the earlier requests' pages, as ``policy.balanced_phases``), list its C-ZIGZAG runs of new pages.
    Returns ``(phases, run owners, run pages, max pages of a request, every run one page)`` or None."""
    P, C = config.page_size, config.cp_size
    S = 2 * C
    balanced = config.owner_policy == BALANCED and C > 1
    legacy = config.owner_policy == LEGACY
    interleave = config.cp_strategy == INTERLEAVE
    free: list[int] = pool.free.tolist() if balanced else []
    transient = [0] * C
    phases: list[int] = []
    owners: list[int] = []
    pages: list[int] = []
    m_max, one_each = 0, True
    for i, (a, n, x) in enumerate(zip(l0, e, last, strict=True)):
        if a < 0 or n < 0 or a % P or a + n > MAX_POSITION:
            return None
        if a == 0:
            if x != -1:
                return None
        elif x % P != P - 1 or not pool.holds(x // P):  # x < 0 has no page: holds() says no
            return None
        m = -(-n // P)
        f = 0 if legacy else (a // P + i) % C
        if balanced and m:
            f = balanced_phase(free, transient, m, f, n % P != 0, interleave)
        phases.append(f)
        if m == 0:
            continue
        m_max = max(m_max, m)
        if interleave:  # C-INTERLEAVE: page j on lane (phase + j) % C, a run of one page each
            if len(owners) + m > _FEW:
                return None  # many pages: the general path's closed form costs less than Python lists
            owners.extend((f + j) % C for j in range(m))
            pages.extend([1] * m)
            continue
        base, rem = divmod(m, S)
        if base:
            one_each = False
            for s in range(S):
                owners.append(((s if s < C else S - 1 - s) + f) % C)
                pages.append(base + (s < rem))
        else:  # m < 2C: segments 0 .. m-1 of one page each
            for s in range(m):
                owners.append(((s if s < C else S - 1 - s) + f) % C)
                pages.append(1)
    if len(owners) > _ONE_EACH:
        one_each = False
    return phases, owners, pages, m_max, one_each


def _slots(new_pages: np.ndarray, e: list[int], P: int) -> np.ndarray:
    """``out_cache_loc`` of page-aligned requests, int64 ``[sum e]``: each page's ``p*P + 0 .. P-1`` in order,
    a request's last page only as far as its extend ``e[i]`` (``new_pages`` in request order)."""
    k = new_pages.shape[0]
    if k == 1 and len(e) == 1:  # one request of one page
        start = int(new_pages[0]) * P
        return np.arange(start, start + e[0], dtype=_I64)
    out = np.empty((k, P), dtype=_I64)
    np.multiply(new_pages[:, None], P, out=out)
    out += RAMP[:P] if P <= RAMP.shape[0] else np.arange(P, dtype=_I64)
    flat = out.reshape(-1)
    if k * P == sum(e):  # every last page full
        return flat
    if len(e) == 1:
        return flat[: e[0]]
    starts = list(accumulate((-(-n // P) * P for n in e[:-1]), initial=0))  # each request's first token
    return np.concatenate([flat[t : t + n] for t, n in zip(starts, e, strict=True)])
