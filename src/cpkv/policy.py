"""Owner-policy rules: which lane owns a request's zigzag segment 0 (SPEC C-PHASE, C-ZIGZAG, C-BALANCED).

Pure functions of lengths, batch positions and free pages per lane; no allocator, no plan:
- ``rotation_phase``: ``(prefix_len // P + req_index) % C`` (C-PHASE), the one place it is written;
- ``zigzag_rank_pages`` / ``zigzag_lane_pages``: a request's new pages per zigzag rank / lane (C-ZIGZAG);
- ``balanced_phase`` / ``balanced_phases``: C-BALANCED's phase of each request of a batch;
- ``one_page_lanes``: the lane of each new page of a batch whose requests take at most one new page each,
  under any policy (``legacy``: 0; ``rotation``: the rotation phase; ``balanced``: C-BALANCED for one page);
- ``follows_free_pages``: whether a policy's phases depend on the free pages (a plan made under other free
  pages may differ).
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from .config import BALANCED, LEGACY, ROTATION, CPConfig

_I64 = np.int64


def rotation_phase(prefix_len, req_index, page_size: int, cp_size: int):
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
    return np.roll(zigzag_rank_pages(np.array([num_pages], dtype=_I64), cp_size)[0], phase)


def zigzag_rank_pages(num_pages: np.ndarray, cp_size: int) -> np.ndarray:
    """Pages of each zigzag rank for requests of ``num_pages`` new pages (int64 ``[k]``), int64 ``[k, C]``
    (C-ZIGZAG): rank z holds segments z and 2C-1-z, so ``2 * (m // 2C) + [z < m % 2C] + [2C-1-z < m % 2C]``.
    Under phase f rank z's pages are on lane ``(z + f) % C`` (``zigzag_lane_pages``). Example m=3, C=4:
    [1, 1, 1, 0]."""
    C = cp_size
    base, rem = np.divmod(num_pages, 2 * C)
    z = np.arange(C, dtype=_I64)
    return 2 * base[:, None] + (z < rem[:, None]) + (2 * C - 1 - z < rem[:, None])


def balanced_phases(prefix_lens: np.ndarray, extend_lens: np.ndarray, free_pages: np.ndarray, page_size: int,
                    cp_size: int) -> np.ndarray:  # fmt: skip
    """C-BALANCED: each request's phase, requests in batch order, ``[B]`` int64.

    ``prefix_lens``, ``extend_lens``: int64 ``[B]`` (checked); ``free_pages``: int64 ``[C]`` free pages per
    lane before the batch (not modified). For request i with new pages ``n_r(f)`` per lane under phase f
    (C-ZIGZAG) and ``free_r`` the free pages left after the earlier requests of the batch, the phase
    maximises, in this order, (1) ``min_r(free_r - n_r(f))`` (the tightest lane after placement), (2)
    ``sum_r n_r(f) * free_r`` (pages go to freer lanes), then minimises (3) ``(f - rotation_phase) mod C``.
    Integers only, so every rank makes the same choice. A request without new pages takes the rotation
    phase. Example C=2, P=1, free [4, 5], one 8-token prompt in chunks of 3, 3, 2: phases 0, 1, 0 (free
    [3, 3], [1, 2], [0, 1]); C=2, Q=2 (free [1, 2]): one-token batches get lanes 1, then 0.
    """
    L0, E, P, C = prefix_lens, extend_lens, page_size, cp_size
    m = -(-(L0 + E) // P) - -(-L0 // P)  # [B] new pages
    rotation = rotation_phase(L0, np.arange(L0.shape[0], dtype=_I64), P, C)  # [B]
    phases = rotation.copy()
    if C == 1:
        return phases
    rows = m.nonzero()[0]
    free = free_pages.tolist()  # [C] Python ints: a few requests of C lanes cost less than numpy calls
    for i, pages, f in zip(rows.tolist(), m[rows].tolist(), rotation[rows].tolist(), strict=True):
        phases[i] = balanced_phase(free, pages, f)
    return phases


def balanced_phase(free: list[int], m: int, rotation: int) -> int:
    """C-BALANCED phase of one request of ``m >= 1`` new pages given ``free``, each lane's free pages
    (``C`` ints, lowered here by the request's pages on each lane), and its ``rotation`` phase.

    C-ZIGZAG gives zigzag rank z ``2 * (m // 2C) + [z < m % 2C] + [2C-1-z < m % 2C]`` pages: k pages on every
    rank plus one on a cyclic window of ``w < C`` consecutive ranks from rank s. With ``rem = m % 2C``:
    ``rem < C``: ``k = 2 * (m // 2C)``, window ranks ``[0, rem)``; ``rem >= C``: ``k = 2 * (m // 2C) + 1``,
    window ranks ``[2C - rem, C)``. Phase f puts rank z on lane ``(z + f) % C``, so the window covers lanes
    ``g .. g + w - 1`` (mod C) from ``g = (f + s) % C``. Criterion 1, ``min_r(free_r - n_r(f))``, is then
    ``min(free) - k - 1`` when the window holds a least-free lane, else ``min(free) - k``; criterion 2,
    ``sum_r n_r(f) * free_r``, is ``k * sum(free)`` plus the window's free pages; criterion 3 takes the
    first best phase cyclically from ``rotation``. O(C) integer work, no [C, C] table.
    Example C=4, free [7, 8, 8, 8], m=3, rotation 0: the window is 3 lanes from lane f; only phase 1
    (lanes 1, 2, 3) leaves out lane 0, the least free -> phase 1, free [7, 7, 7, 7].
    """
    C = len(free)
    k, rem = divmod(m, 2 * C)
    k, w, s = (2 * k, rem, 0) if rem < C else (2 * k + 1, rem - C, 2 * C - rem)  # rem = C: k + 1 everywhere
    f = rotation
    if w:  # else every lane takes k pages: all phases tie
        least = min(free)
        twice = free + free
        wsum = list(accumulate(twice, initial=0))  # window [g, g + w) holds wsum[g + w] - wsum[g] free pages
        lows = list(accumulate([v == least for v in twice], initial=0))  # least-free lanes likewise
        best = None
        for d in range(C):
            g = (rotation + d + s) % C
            key = (lows[g + w] == lows[g], wsum[g + w] - wsum[g])
            if best is None or key > best:
                best, f = key, (rotation + d) % C
        g = (f + s) % C
        for j in range(g, g + w):
            free[j if j < C else j - C] -= 1
    if k:
        free[:] = [v - k for v in free]
    return f


def one_page_lanes(prefix_lens: np.ndarray, new_rows: np.ndarray, free_pages: np.ndarray,
                   config: CPConfig) -> list[int]:  # fmt: skip
    """Lane of each new page of a batch whose requests take at most one new page each, requests in batch
    order (each sees the pages of the earlier ones): a list of ``len(new_rows)`` ints.

    ``prefix_lens``: int64 ``[B]``; ``new_rows``: int64 ``[k]`` requests that take a page (their batch
    positions), ascending; ``free_pages``: int64 ``[C]`` free pages per lane (not modified). With one new
    page, C-ZIGZAG puts it in segment 0, owned by the request's phase, so this is the phase under
    ``config.owner_policy``: ``legacy`` 0, ``rotation`` the rotation phase, and ``balanced``: C-BALANCED for
    one page reduces to "the lane with the most free pages, ties to the first at or after the rotation
    phase, cyclically". Placing one page on lane f leaves ``min_r free_r`` when lane f is not a least-free
    lane and one less otherwise (criterion 1), and ``sum_r n_r(f) free_r`` is ``free_f`` (criterion 2), so
    every most-free lane ties on both and criterion 3 picks among them. Example C=4, free [5, 7, 7, 6],
    rotation phases [3, 0]: lanes [1, 2].
    """
    C, k = config.cp_size, new_rows.shape[0]
    if C == 1 or config.owner_policy == LEGACY:
        return [0] * k
    rotation = rotation_phase(prefix_lens[new_rows], new_rows, config.page_size, C).tolist()
    if config.owner_policy == ROTATION:
        return rotation
    free = free_pages.tolist()
    lanes = []
    for f in rotation:  # C-BALANCED for one page: the most free lane, first from the rotation phase
        most = max(free)
        while free[f] != most:
            f = f + 1 if f + 1 < C else 0
        free[f] -= 1
        lanes.append(f)
    return lanes
