"""Per-rank KV lengths of one request on owner lanes (SPEC C-DRAFT).

A rank's attention over a sharded pool sees only the positions whose page is on its lane; the partial
results merge across ranks (softmax statistics). Each rank therefore needs, per request, how many of the
request's positions it holds. These are always recomputed from the global length and the request's pages,
never adjusted by an accepted-token count (that drifts apart across ranks), and they sum to the length.

A replicated pool (C-POOL) has no lanes: every rank holds all ``L`` positions; these functions are for
sharded pools.
"""

from __future__ import annotations

import numpy as np

from .config import CPConfig
from .errors import ConfigError, PlanError
from .validate import as_int, as_int_array

_I64 = np.int64


def rank_kv_lens(page_ids: object, seq_len: int, config: CPConfig) -> np.ndarray:
    """KV positions ``< seq_len`` of one request that each lane holds, int64 ``[C]`` (SPEC C-DRAFT).

    ``page_ids`` are the request's pages in position order: page i holds positions ``i*P .. i*P + P-1``
    and lives on lane ``page_ids[i] % C``. Lane r holds ``sum_i min(P, max(0, seq_len - i*P))`` over its
    pages; the sum over lanes is ``seq_len``. Example C=2, P=4, pages ``[5, 2, 7]`` (lanes 1, 0, 1),
    ``seq_len=10``: page 5 holds 4, page 2 holds 4, page 7 holds 2 -> ``[4, 6]``.

    Args:
        page_ids: ``[m]`` page ids (ints >= 0; list, numpy or CPU tensor), position order.
        seq_len: the request's length L in tokens, ``0 <= L <= m * P``.
        config: ``CPConfig`` giving cp_size (C) and page_size (P).

    Returns:
        ``[C]`` int64 positions per lane (tokens).

    Raises:
        ConfigError: ``config`` not a ``CPConfig``. PlanError: a negative page id, ``seq_len`` not an int,
            negative or beyond the pages (``> m * P``).
    """
    pages, L = _check(page_ids, seq_len, 0, config)
    C, P = config.cp_size, config.page_size
    full = L // P  # pages whose P positions are all < L
    out = np.bincount(pages[:full] % C, minlength=C).astype(_I64) * P
    if L % P:
        out[pages[full] % C] += L % P  # the partly kept last page
    return out


def verify_rank_kv_lens(
    page_ids: object, seq_len: int, num_draft_tokens: int, config: CPConfig
) -> np.ndarray:
    """Per-lane KV lengths of the k verify queries of one speculative step, int64 ``[k, C]`` (C-DRAFT).

    The draft tokens sit at positions ``seq_len .. seq_len + k - 1``; query j (position ``seq_len + j``)
    attends to positions ``0 .. seq_len + j``, so row j is ``rank_kv_lens(page_ids, seq_len + j + 1)`` and
    sums to ``seq_len + j + 1``. Row j adds to row j-1 the one position ``seq_len + j``, on lane
    ``page_ids[(seq_len + j) // P] % C``. Example C=2, P=4, pages ``[5, 2, 7]``, ``seq_len=7``, k=3:
    positions 7 (page 2, lane 0), 8 and 9 (page 7, lane 1) -> ``[[4, 4], [4, 5], [4, 6]]``.

    Args:
        page_ids: ``[m]`` page ids in position order, covering the drafts: ``seq_len + k <= m * P``.
        seq_len: tokens cached before the drafts (L >= 0). num_draft_tokens: k >= 1.
        config: ``CPConfig`` (C, P).

    Returns:
        ``[k, C]`` int64 positions per lane (tokens) for each verify query.

    Raises:
        ConfigError, PlanError: as ``rank_kv_lens``; ``num_draft_tokens`` not an int >= 1, or
            ``seq_len + k`` beyond the pages.
    """
    k = num_draft_tokens
    if isinstance(k, bool) or not hasattr(k, "__index__") or int(k) < 1:
        raise PlanError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}")
    k = int(num_draft_tokens)
    pages, L = _check(page_ids, seq_len, k, config)
    C, P = config.cp_size, config.page_size
    base = rank_kv_lens(pages, L, config)  # [C]
    lanes = pages[(L + np.arange(k, dtype=_I64)) // P] % C  # [k] lane of each draft position
    steps = np.zeros((k, C), dtype=_I64)
    steps[np.arange(k), lanes] = 1
    return base + np.cumsum(steps, axis=0)


def _check(page_ids: object, seq_len: object, extra: int, config: object) -> tuple[np.ndarray, int]:
    """``(pages int64 [m], seq_len)`` after the checks of ``rank_kv_lens`` (``seq_len + extra <= m * P``)."""
    if not isinstance(config, CPConfig):
        raise ConfigError(f"config must be a CPConfig, got {type(config).__name__}")
    pages = as_int_array("page_ids", page_ids)
    bad = np.flatnonzero(pages < 0)
    if bad.size:
        i = int(bad[0])
        raise PlanError(f"page_ids[{i}]={int(pages[i])} is negative; a request's pages are ids >= 0")
    L, P, m = as_int("seq_len", seq_len, PlanError), config.page_size, pages.shape[0]
    if L < 0:
        raise PlanError(f"seq_len={L} must be >= 0")
    if L + extra > m * P:
        need = f"seq_len + num_draft_tokens = {L + extra}" if extra else f"seq_len={L}"
        raise PlanError(
            f"{need} out of range [0, {m * P}]: the request's {m} pages of {P} tokens hold positions 0 .. {m * P - 1}"
        )
    return pages, L
