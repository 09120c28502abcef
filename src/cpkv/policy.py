"""Owner-policy rules: which lane owns a request's first new page (its phase) (SPEC C-PHASE, C-ZIGZAG,
C-INTERLEAVE, C-BALANCED).

Pure functions of lengths, batch positions and free pages per lane; no allocator, no plan:
- ``rotation_phase``: ``(prefix_len // P + req_index) % C`` (C-PHASE), the one place it is written;
- ``zigzag_rank_pages`` / ``zigzag_lane_pages``: a request's new pages per zigzag rank / lane (C-ZIGZAG);
  ``lane_pages``: per lane under either CP strategy (C-INTERLEAVE: ``m // C`` each, one more on ``m % C`` lanes);
- ``balanced_phase`` / ``balanced_phases``: C-BALANCED's phase of each request of a batch (as amended: fit on
  every new page, balance on the pages a request keeps), with pages counted by the CP strategy's rule;
- ``one_page_lanes``: the lane of each new page of a batch whose requests take at most one new page each,
  under any policy (``legacy``: 0; ``rotation``: the rotation phase; ``balanced``: C-BALANCED for one page);
- ``follows_free_pages``: whether a policy's phases depend on the free pages (a plan made under other free
  pages may differ); ``STATELESS_POLICY``: the policy of plans made without them.
"""

from __future__ import annotations

from itertools import accumulate
from typing import overload

import numpy as np

from .config import BALANCED, INTERLEAVE, LEGACY, ROTATION, ZIGZAG, CPConfig

_I64 = np.int64

STATELESS_POLICY = ROTATION
"""The owner policy of plans made without an allocator's free pages: ``rotation`` (C-PHASE, a function of
positions alone). A group whose pages are not placed by the ranks that compute them plans its compute so
(``sim.storage.compute.CPCompute``)."""


@overload
def rotation_phase(prefix_len: int, req_index: int, page_size: int, cp_size: int) -> int: ...
@overload
def rotation_phase(
    prefix_len: np.ndarray, req_index: np.ndarray, page_size: int, cp_size: int
) -> np.ndarray: ...
def rotation_phase(
    prefix_len: int | np.ndarray, req_index: int | np.ndarray, page_size: int, cp_size: int
) -> int | np.ndarray:
    """C-PHASE rotation phase ``(prefix_len // page_size + req_index) % cp_size``.

    ``prefix_len`` and ``req_index`` are ints (the result is an int) or int64 arrays of one shape (the
    result is an int64 array of that shape); ``page_size``, ``cp_size``: ints >= 1 (unchecked here).
    Example P=64, C=4: prefix 130 at batch position 3 -> (2 + 3) % 4 = 1.
    """
    return (prefix_len // page_size + req_index) % cp_size


def follows_free_pages(policy: str) -> bool:
    """Whether ``policy`` chooses phases from the free pages per lane (``balanced``, C-BALANCED) rather than
    from positions alone (``rotation``, ``legacy``)."""
    return policy == BALANCED


def zigzag_lane_pages(num_pages: int, phase: int, cp_size: int) -> np.ndarray:
    """Pages per lane of a request with ``num_pages`` new pages and ``phase`` (C-ZIGZAG), int64 ``[C]``.

    Zigzag rank z holds segments z and 2C-1-z, each ``m // 2C`` pages plus one for the first
    ``m % 2C`` segments; lane ``(z + phase) % C``. Example m=16, C=4, phase 1 -> [4, 4, 4, 4];
    m=3, C=4, phase 1 -> [0, 1, 1, 1]. O(C).
    """
    rank_pages: np.ndarray = zigzag_rank_pages(np.array([num_pages], dtype=_I64), cp_size)[0]
    return np.roll(rank_pages, phase)


def lane_pages(num_pages: int, phase: int, cp_size: int, cp_strategy: str = ZIGZAG) -> np.ndarray:
    """Pages per lane, int64 ``[C]``, of a request with ``num_pages`` new pages and ``phase`` under
    ``cp_strategy``: ``zigzag_lane_pages`` (C-ZIGZAG) or, under ``interleave`` (C-INTERLEAVE), ``m // C`` on
    every lane and one more on the ``m % C`` lanes ``phase, phase + 1, ...`` (mod C). Example m=6, C=4,
    phase 3, interleave -> [2, 1, 1, 2]. O(C)."""
    if cp_strategy != INTERLEAVE:
        return zigzag_lane_pages(num_pages, phase, cp_size)
    pages: np.ndarray = cyclic_lane_pages(
        np.array([num_pages], dtype=_I64), np.array([phase], dtype=_I64), cp_size
    )[0]
    return pages


def lane_mod(x: np.ndarray, cp_size: int) -> np.ndarray:
    """``x % cp_size`` for int64 ``x >= 0`` (a new array): a bitwise and when cp_size is a power of two
    (numpy's integer ``%`` costs several times more)."""
    out: np.ndarray = x & (cp_size - 1) if cp_size & (cp_size - 1) == 0 else x % cp_size
    return out


def cyclic_lane_pages(num_pages: np.ndarray, phases: np.ndarray, cp_size: int) -> np.ndarray:
    """Pages per request and lane under C-INTERLEAVE, int64 ``[B, C]`` (a new array): request i's
    ``num_pages[i]`` new pages go round robin from lane ``phases[i]``, so lane r holds ``m // C`` of them plus
    one when ``(r - phase) % C < m % C``. ``num_pages``, ``phases``: int64 ``[B]``. O(B * C).
    Example m [6, 3], phases [3, 0], C 4 -> [[2, 1, 1, 2], [1, 1, 1, 0]]."""
    q, rem = np.divmod(num_pages, cp_size)
    rel = lane_mod(np.arange(cp_size, cp_size * 2, dtype=_I64)[None, :] - phases[:, None], cp_size)  # [B, C]
    return q[:, None] + (rel < rem[:, None])


def zigzag_rank_pages(num_pages: np.ndarray, cp_size: int) -> np.ndarray:
    """Pages of each zigzag rank for requests of ``num_pages`` new pages (int64 ``[k]``), int64 ``[k, C]``
    (C-ZIGZAG): rank z holds segments z and 2C-1-z, so ``2 * (m // 2C) + [z < m % 2C] + [2C-1-z < m % 2C]``.
    Under phase f rank z's pages are on lane ``(z + f) % C`` (``zigzag_lane_pages``). Example m=3, C=4:
    [1, 1, 1, 0]."""
    C = cp_size
    base, rem = np.divmod(num_pages, 2 * C)
    z = np.arange(C, dtype=_I64)
    return 2 * base[:, None] + (z < rem[:, None]) + (2 * C - 1 - z < rem[:, None])


def balanced_phases(
    prefix_lens: np.ndarray,
    extend_lens: np.ndarray,
    free_pages: np.ndarray,
    page_size: int,
    cp_size: int,
    cp_strategy: str = ZIGZAG,
) -> np.ndarray:
    """C-BALANCED: each request's phase, requests in batch order (``balanced_phase``), ``[B]`` int64, with
    ``n_r(f)`` and ``k_r(f)`` counted by ``cp_strategy``'s rule (C-ZIGZAG or C-INTERLEAVE).

    ``prefix_lens``, ``extend_lens``: int64 ``[B]`` (checked); ``free_pages``: int64 ``[C]`` free pages per
    lane before the batch (not modified). Each request sees the free pages the earlier ones left and the
    partly filled last pages they took (transient: freed after prefill, so balance counts only the pages a
    request keeps). A request without new pages takes the rotation phase. Integers only, so every rank
    makes the same choice. Example C=2, P=1, free [4, 5], one 8-token prompt in chunks of 3, 3, 2: phases
    0, 1, 0 (free [3, 3], [1, 2], [0, 1]); C=2, Q=2 (free [1, 2]): one-token batches get lanes 1, then 0.
    """
    L0, E, P, C = prefix_lens, extend_lens, page_size, cp_size
    end = L0 + E
    m = -(-end // P) - -(-L0 // P)  # [B] new pages
    rotation = rotation_phase(L0, np.arange(L0.shape[0], dtype=_I64), P, C)  # [B]
    phases: np.ndarray = rotation.copy()
    if C == 1:
        return phases
    rows = m.nonzero()[0]
    free = free_pages.tolist()  # [C] Python ints: a few requests of C lanes cost less than numpy calls
    transient = [0] * C
    partial = (end[rows] % P != 0).tolist()
    interleave = cp_strategy == INTERLEAVE
    for i, pages, f, part in zip(
        rows.tolist(), m[rows].tolist(), rotation[rows].tolist(), partial, strict=True
    ):
        phases[i] = balanced_phase(free, transient, pages, f, part, interleave)
    return phases


def balanced_phase(
    free: list[int], transient: list[int], m: int, rotation: int, partial: bool, interleave: bool = False
) -> int:
    """C-BALANCED phase of one request of ``m >= 1`` new pages, pages counted by C-ZIGZAG (or C-INTERLEAVE
    when ``interleave``); the criteria are C-BALANCED's, the O(C) derivation is in docs/placement.md.

    ``free``: free pages per lane (``C`` ints) after the batch's earlier requests; ``transient``: the partly
    filled last pages those requests took per lane (``t_r``); both are updated in place by this request.
    ``partial``: the extend leaves its last new page partly filled (``(L0 + E) % P != 0``), so that page is
    transient. ``rotation``: the C-PHASE phase, which wins ties. Returns the phase, an int in ``[0, C)``.
    Example: C=4, free [7, 8, 8, 8], m=3 (whole pages), rotation 0 -> 1 (lanes 1-3 leave out lane 0).
    """
    C = len(free)
    if m == 1:  # one page: the window is the page's own lane f
        if partial:  # keeps nothing: the lane with the most free pages
            most, f = max(free), rotation
            while free[f] != most:
                f = f + 1 if f + 1 < C else 0
            transient[f] += 1
        else:  # keeps it: most free + transient pages among the lanes with a free page (criterion 0). Where
            # an earlier request of the batch left a lane short (free < 0: the simulator plans before it
            # evicts), criterion 0 read literally lets no phase fit; a lane with a free page is still
            # preferred here, so the page does not go to a lane whose only pages the batch holds
            # (C-BALANCED's recorded deviation).
            fits = any(v > 0 for v in free)
            best, f = None, rotation
            for d in range(C):
                j = (rotation + d) % C
                if fits and free[j] <= 0:
                    continue
                if best is None or free[j] + transient[j] > best:
                    best, f = free[j] + transient[j], j
        free[f] -= 1
        return f
    if interleave:
        K, w = divmod(m, C)
        s, zl = 0, (m - 1) % C  # the window starts at the phase; zl: the last page's rank
    else:
        q, rem = divmod(m, 2 * C)
        K, w, s = (
            (2 * q, rem, 0) if rem < C else (2 * q + 1, rem - C, 2 * C - rem)
        )  # rem = C: K + 1 everywhere
        zl = 0 if m >= 2 * C else (m - 1 if m <= C else 2 * C - m)  # zigzag rank of the last page
    last_in_window = s <= zl < s + w
    least = min(free)
    low = list(accumulate([v == least for v in free + free], initial=0))  # least-free lanes
    g_ = [a + b for a, b in zip(free, transient, strict=True)]  # g_r: m > 1 keeps at least one page
    gl = min(g_)
    gsum = sum(g_)
    gs = list(accumulate(g_ + g_, initial=0))  # window [g, g + w) holds gs[g + w] - gs[g]
    g0 = list(accumulate([v == gl for v in g_ + g_], initial=0))  # least-g lanes
    g1 = list(accumulate([v == gl + 1 for v in g_ + g_], initial=0)) if partial else []
    best_key: tuple[bool, int, int] | None = None
    f = rotation
    for d in range(C):
        ph = (rotation + d) % C
        g = (ph + s) % C  # the window's first lane
        fit = least - K - (low[g + w] > low[g]) >= 0
        a = g0[g + w] - g0[g]  # least-g lanes in the window
        mn = gl - K - (a > 0)  # min_r(g_r - n_r)
        wsum = gsum * K + gs[g + w] - gs[g]  # sum_r n_r * g_r
        if partial:  # the last page is transient: it counts for the fit, not in k_r
            L = (zl + ph) % C
            if g_[L] - K - last_in_window == mn and (a if a else g1[g + w] - g1[g] + g0[C]) == 1:
                mn += 1  # the last page's lane was the only one at the minimum
            wsum -= g_[L]
        key = (fit, mn, wsum)
        if best_key is None or key > best_key:
            best_key, f = key, ph
    g = (f + s) % C
    for j in range(g, g + w):
        free[j if j < C else j - C] -= 1
    if K:
        free[:] = [v - K for v in free]
    if partial:
        transient[(zl + f) % C] += 1
    return f


def one_page_lanes(
    prefix_lens: np.ndarray,
    extend_lens: np.ndarray | None,
    new_rows: np.ndarray,
    free_pages: np.ndarray,
    config: CPConfig,
) -> list[int]:
    """Lane of each new page of a batch whose requests take at most one new page each, requests in batch
    order (each sees the pages of the earlier ones): a list of ``len(new_rows)`` ints.

    ``prefix_lens``: int64 ``[B]``; ``extend_lens``: int64 ``[B]``, or None for one token each (decode);
    ``new_rows``: int64 ``[k]`` requests that take a page (their batch positions), ascending;
    ``free_pages``: int64 ``[C]`` free pages per lane (not modified). With one new page, C-ZIGZAG puts it in
    segment 0 and C-INTERLEAVE on lane ``phase + 0``: under either CP strategy its owner is the request's
    phase, so this is the phase under ``config.owner_policy``: ``legacy`` 0, ``rotation`` the rotation phase,
    ``balanced`` ``balanced_phase`` with one page (the one rule).
    Example C=4, balanced, free [5, 7, 7, 6], one-token requests (partly filled pages, kept by none) with
    rotation phases [3, 0]: lanes [1, 2].
    """
    C, k = config.cp_size, new_rows.shape[0]
    if C == 1 or config.owner_policy == LEGACY:
        return [0] * k
    P = config.page_size
    rotation: list[int] = rotation_phase(prefix_lens[new_rows], new_rows, P, C).tolist()
    if config.owner_policy == ROTATION:
        return rotation
    end = (prefix_lens[new_rows] + (1 if extend_lens is None else extend_lens[new_rows])).tolist()
    free, transient = free_pages.tolist(), [0] * C
    return [balanced_phase(free, transient, 1, f, e % P != 0) for f, e in zip(rotation, end, strict=True)]
