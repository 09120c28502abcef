"""The ``interleave`` split of a batch (SPEC C-INTERLEAVE): new page k of a request on lane ``(phase + k) % C``.

``interleave_split`` is the planner's page rule under ``cp_strategy="interleave"`` (``planner.plan_arrays``
calls it where zigzag calls its segment tables): page owners, tokens per request and rank and each request's
last token's owner in closed form, O(B * C) plus one pass to write the page owners; the token runs (one per
head and per page) are deferred until a consumer reads them (``TokenRuns.deferred``), so planning a batch
never pays O(pages) more than its page owners; a single request's page owners are a view of a cached cyclic
table (one per recently used cp_size, at most ``_CYCLIC_TABLES`` of them, about 32 MiB). ``cyclic`` writes
``(start + j) % C`` by doubling copies (numpy's integer ``%`` costs several nanoseconds an element; a copy a
fraction of one).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .policy import cyclic_lane_pages, lane_mod
from .runs import RAMP, TokenRuns, indptr

_I64 = np.int64


def cyclic(start: int, n: int, cp_size: int) -> np.ndarray:
    """int64 ``[n]``: ``(start + j) % cp_size`` for ``j = 0 .. n-1`` (a new, writable array).

    The first period is computed, then the filled prefix (a whole number of periods) is copied after itself
    until n entries exist: O(n) copies, log2(n / C) numpy calls. Example start 3, n 6, C 4 -> [3, 0, 1, 2, 3, 0].
    """
    out = np.empty(n, dtype=_I64)
    k = min(n, cp_size)
    out[:k] = (
        (start + RAMP[:k]) % cp_size if k <= RAMP.shape[0] else (start + np.arange(k, dtype=_I64)) % cp_size
    )
    filled = k
    while filled < n:
        c = min(filled, n - filled)
        out[filled : filled + c] = out[:c]
        filled += c
    return out


_CYCLIC_MAX = 1 << 20  # pages of the largest request served from a cached cyclic table (8 MiB a table)
_CYCLIC_TABLES = 4  # cached tables (cp_sizes) at most, least recently used dropped: 4 * (2**20 + C) int64
_CYCLIC: dict[int, np.ndarray] = {}  # cp_size -> its table, least recently used first


def _cyclic_view(start: int, n: int, cp_size: int) -> np.ndarray:
    """Read-only int64 ``[n]``, ``(start + j) % cp_size`` (``start`` in ``[0, cp_size)``): for
    ``n <= _CYCLIC_MAX`` a view of a cached ``cyclic(0, L, cp_size)`` table (L grown by doubling, at most
    ``_CYCLIC_MAX + cp_size``), else a new array. The tables of the ``_CYCLIC_TABLES`` most recently used
    cp_sizes are kept (at most about 32 MiB), so a process that plans under many cp_sizes (a sweep) stays
    bounded; a plan keeps its view's table alive on its own."""
    if n > _CYCLIC_MAX:
        out = cyclic(start, n, cp_size)
        out.setflags(write=False)
        return out
    table = _CYCLIC.pop(cp_size, None)
    if table is None or table.shape[0] < n + start:
        size = max(n + start, 2 * (0 if table is None else table.shape[0]), 4096)
        table = cyclic(0, min(size, _CYCLIC_MAX + cp_size), cp_size)
        table.setflags(write=False)
    _CYCLIC[cp_size] = table  # most recently used last
    if len(_CYCLIC) > _CYCLIC_TABLES:
        for key in list(_CYCLIC)[:-_CYCLIC_TABLES]:
            _CYCLIC.pop(key, None)
    return table[start : start + n]


def interleave_split(
    E: np.ndarray, h: np.ndarray, head: np.ndarray, phase: np.ndarray, C: int, P: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, TokenRuns]:
    """C-HEAD and C-INTERLEAVE for a batch: ``(m, page_owners, per_request_rank_tokens, last_token_owner,
    runs)``: new pages int64 ``[B]``, the owner of every new page int64 ``[sum m]`` (request order), int64
    ``[B, C]`` tokens each rank computes of each request, int64 ``[B]`` the owner of each request's last token
    (-1 when E == 0) and the deferred ``TokenRuns``.

    ``E``, ``h`` (head tokens), ``head`` (recorded head owner, -1 where h == 0) and ``phase`` are int64
    ``[B]``. The ``t = E - h`` tokens past the head start new pages, ``m = ceil(t / P)``; page k of request i
    is on lane ``(phase_i + k) % C``, so lane r holds ``m // C`` of its pages plus one when
    ``(r - phase) % C < m % C`` (``policy.cyclic_lane_pages``), each of P tokens but the last page, which
    lacks ``(-t) % P`` and is on lane ``(phase + m - 1) % C``; the h head tokens are the head owner's.
    Example C=4, P=64, E=1000, phase 0: page owners [0,1,2,3] * 4, tokens [256, 256, 256, 232], last 3.
    """
    B = E.shape[0]
    t = E - h  # [B] tokens on new pages
    m = -(-t // P)  # [B] new pages
    first = indptr(m)  # [B + 1] each request's first flat page
    N = int(first[-1])
    if B == 1:  # a read-only view of the cp_size's cyclic table: no pass over the pages
        page_owners = _cyclic_view(int(phase[0]), N, C)
    else:  # flat page j of request i: lane (j + shift_i) % C, shift_i = (phase_i - first_i) % C in [0, C)
        shift = (phase - first[:-1]) % C
        j = (
            RAMP[:N] + np.repeat(shift, m)
            if N <= RAMP.shape[0]
            else np.arange(N, dtype=_I64) + np.repeat(shift, m)
        )
        page_owners = j & (C - 1) if C & (C - 1) == 0 else cyclic(0, N + C, C).take(j)
    has = m > 0
    last_owner = np.where(has, lane_mod(phase + m - 1, C), head)
    per_req = cyclic_lane_pages(m, phase, C)  # [B, C] pages, then tokens
    per_req *= P
    rows = has.nonzero()[0]
    per_req[rows, last_owner[rows]] -= (-t[rows]) % P
    rows = (h > 0).nonzero()[0]
    if rows.shape[0]:
        np.add.at(per_req, (rows, head[rows]), h[rows])
    runs = TokenRuns.deferred(partial(_page_runs, E, h, head, m, first, page_owners, P))
    return m, page_owners, per_req, last_owner, runs


def _page_runs(
    E: np.ndarray,
    h: np.ndarray,
    head: np.ndarray,
    m: np.ndarray,
    first: np.ndarray,
    page_owners: np.ndarray,
    P: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(req, owner, length, pages)`` int64 ``[R]`` each: per request its head run (h tokens, no new page;
    none when h == 0), then one run per new page (P tokens, the last one ``P - (-t) % P``)."""
    B, N = E.shape[0], page_owners.shape[0]
    deficit = -(E - h) % P  # [B] tokens the last new page lacks
    has = m > 0
    if not np.count_nonzero(h):  # no head runs: the runs are the pages
        length = np.full(N, P, dtype=_I64)
        length[first[1:][has] - 1] -= deficit[has]
        return np.repeat(np.arange(B, dtype=_I64), m), page_owners, length, np.ones(N, dtype=_I64)
    R = N + B  # request i's head at run first_i + i, its pages after it; empty head runs dropped at the end
    head_at = first[:-1] + np.arange(B, dtype=_I64)
    owner = np.empty(R, dtype=_I64)
    length = np.full(R, P, dtype=_I64)
    pages = np.ones(R, dtype=_I64)
    is_page = np.ones(R, dtype=bool)
    is_page[head_at] = False
    owner[is_page] = page_owners
    owner[head_at], pages[head_at] = head, 0
    length[(head_at + m)[has]] -= deficit[has]
    length[head_at] = h
    keep = (length > 0).nonzero()[0]
    req = np.repeat(np.arange(B, dtype=_I64), m + 1)
    return req.take(keep), owner.take(keep), length.take(keep), pages.take(keep)
