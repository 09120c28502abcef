"""The numpy reference of ``out_cache_loc``: the slot of every extend token of an allocated batch (SPEC
section 7, C-HEAD, C-ALLOC).

Per request, its head tokens take ``last_loc + 1, ...`` (the rest of the partly filled last prefix page),
then each new page p gives ``p*P + 0 .. P-1``, the last one only as far as ``prefix_len + extend_len``.
``extend_slots`` works from a ``BatchPlan`` and its pages; ``one_page_slots`` is the same function for a
batch whose requests each take at most one new page (decode steps, small calls), which needs no plan.
The allocator builds ``out_cache_loc`` with them on the host; the Triton kernel
(``kernels.slots.fill_out_cache_loc``) and the tests compare against them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .runs import expand_runs

if TYPE_CHECKING:
    from .plan import BatchPlan

_I64 = np.int64


def extend_slots(plan: BatchPlan, last_locs: np.ndarray, new_pages: np.ndarray) -> np.ndarray:
    """``out_cache_loc`` of a planned batch, int64 numpy ``[sum E]``.

    Args:
        plan: the ``BatchPlan`` the pages were allocated for.
        last_locs: ``[B]`` int64 slot of each request's position ``prefix_len - 1`` (-1 without prefix).
        new_pages: ``[sum m]`` int64 pages in ``plan.page_owners`` order.

    One run per head and per new page (a request's last page only up to ``prefix_len + extend_len``).
    Without heads and with every last page full it is the pages' slots in order:
    ``(new_pages[:, None] * P + arange(P)).ravel()``. Example P=4, pages [5, 2]: [20..23, 8..11]; P=4,
    one request L0=10, E=8, last_loc 9, pages [5, 2]: [10, 11, 20, 21, 22, 23, 8, 9].
    """
    P = plan.config.page_size
    h, m = plan.head_tokens, plan.page_indptr[1:] - plan.page_indptr[:-1]
    if not np.count_nonzero(h) and new_pages.shape[0] * P == plan.num_tokens:  # no head, every last page full
        out = np.empty((new_pages.shape[0], P), dtype=_I64)
        np.multiply(new_pages[:, None], P, out=out)
        out += np.arange(P, dtype=_I64)
        return out.ravel()
    # Runs: per request a head run (maybe empty), then one run per new page.
    head_pos = plan.page_indptr[:-1] + np.arange(m.shape[0], dtype=_I64)  # [B] run of each head
    start = np.empty(new_pages.shape[0] + m.shape[0], dtype=_I64)
    length = np.empty(start.shape[0], dtype=_I64)
    length.fill(P)
    is_page = np.ones(start.shape[0], dtype=bool)
    is_page[head_pos] = False
    start[is_page] = new_pages * P
    # A request's last page holds its t = E - h tokens past the head up to L0 + E: it lacks (-t) % P. Written
    # before the heads: a request without new pages has its head run there (t = 0), set next.
    length[head_pos + m] = P - (h - plan.extend_lens) % P
    start[head_pos], length[head_pos] = last_locs + 1, h
    return expand_runs(start, length)


def one_page_slots(
    prefix_lens: np.ndarray,
    extend_lens: np.ndarray | None,
    next_locs: np.ndarray,
    new_rows: np.ndarray,
    new_pages: np.ndarray,
    page_size: int | np.ndarray,
) -> np.ndarray:
    """``out_cache_loc`` of a batch whose requests each take at most one new page, int64 numpy ``[sum E]``.

    Args:
        prefix_lens: ``[B]`` int64 L0. extend_lens: ``[B]`` int64 E (each needing at most one new page), or
            None for a decode step (E = 1 for every request).
        next_locs: ``[B]`` int64 ``last_loc + 1`` of each request; with ``extend_lens`` None it becomes the
            result (written in place).
        new_rows: ``[k]`` int64 requests that take a new page, ascending. new_pages: ``[k]`` int64 their pages.
        page_size: P, an int or a 0-d int64 array.

    Per request its h head tokens ``last_loc + 1 ...`` (C-HEAD, ``h = min(E, P - L0 % P)`` when
    ``L0 % P != 0``), then ``page * P + 0 ..`` for the rest. Decode: ``last_loc + 1``, or ``page * P`` where
    the token starts a new page. Example P=4, L0 [6, 8], E [3, 1], last_locs [9, 23], new page 7 for
    request 0 and 2 for request 1: [10, 11, 28, 8].
    """
    P = page_size
    if extend_lens is None:
        next_locs[new_rows] = new_pages * P
        return next_locs
    rem = prefix_lens % P
    h = np.where(rem != 0, np.minimum(extend_lens, P - rem), 0)  # [B]
    start = np.zeros((prefix_lens.shape[0], 2), dtype=_I64)  # per request: head run, then the new page's run
    start[:, 0] = next_locs
    start[new_rows, 1] = new_pages * P
    length = np.empty_like(start)
    length[:, 0] = h
    length[:, 1] = extend_lens - h
    return expand_runs(start.ravel(), length.ravel())
