"""Run-length toolkit: a batch's tokens as runs of one owner, and the numpy helpers that expand runs.

The planner describes a batch's extend tokens as ``TokenRuns`` (at most ``B * (2C + 1)`` runs under zigzag,
one per head and new page under interleave, built on first read; instead of ``sum E`` tokens); slots, the
gather index, the kernels' tables and the prefix cache expand or rank runs with the helpers here, without a
Python loop over runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_I64 = np.int64
_INT16_MAX = int(np.iinfo(np.int16).max)

RAMP = np.arange(1 << 16, dtype=_I64)  # 512 KiB, fits in L2
"""Read-only int64 ``0, 1, ..., 65535``: sliced for the ramps and strided indices of small batches."""
RAMP.setflags(write=False)


@dataclass(frozen=True)
class TokenRuns:
    """Run-length form of a batch's extend tokens, flat order: per request its head run, then one run per
    zigzag segment (C-ZIGZAG; ``R <= B * (2C + 1)``) or per new page (C-INTERLEAVE; ``R <= B + sum m``), each
    run one owner; empty runs are left out.

    Attributes:
        req: ``[R]`` int64 request of each run.
        owner: ``[R]`` int64 owning (computing) rank.
        length: ``[R]`` int64 tokens of each run (>= 1); a segment's last page holds only the tokens up to
            ``prefix_len + extend_len``.
        pages: ``[R]`` int64 new pages of each run: 0 for a head run, else the segment's pages (1 per run
            under interleave) (their
            order is ``page_owners`` order).
    """

    req: np.ndarray
    owner: np.ndarray
    length: np.ndarray
    pages: np.ndarray

    @classmethod
    def deferred(cls, make: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> TokenRuns:
        """Runs whose four arrays ``make()`` returns, ``(req, owner, length, pages)``, called once, on the first
        read of any of them (C-INTERLEAVE: one run per page, which a plan that only counts pages never reads).
        ``make`` must be pure and picklable (a ``functools.partial`` of a module function over read-only arrays)."""
        runs = object.__new__(cls)
        object.__setattr__(runs, "_make", make)
        return runs

    def __getattr__(
        self, name: str
    ) -> np.ndarray:  # reached only for an attribute not yet set: a deferred run's arrays
        make = self.__dict__.get("_make")
        if make is None or name not in _FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        for key, arr in zip(_FIELDS, make(), strict=True):
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)
        object.__setattr__(self, "_make", None)
        arr_read: np.ndarray = self.__dict__[name]
        return arr_read

    def expand(self, run_start: np.ndarray) -> np.ndarray:
        """``[sum length]`` int64: run j's tokens get ``run_start[j], run_start[j] + 1, ...``.

        Example lengths [2, 1, 3], starts [10, 99, 50] -> [10, 11, 99, 50, 51, 52].
        """
        return expand_runs(run_start, self.length)


_FIELDS = ("req", "owner", "length", "pages")


def run_starts(values: np.ndarray) -> np.ndarray:
    """``[R]`` int64 indices where a run of equal values starts in the 1-D ``values`` (empty -> empty).

    Example [3, 3, 1, 1, 1, 3] -> [0, 2, 5].
    """
    if values.shape[0] == 0:
        return np.zeros(0, dtype=_I64)
    return np.flatnonzero(np.r_[True, values[1:] != values[:-1]]).astype(_I64, copy=False)


def expand_runs(run_start: np.ndarray, length: np.ndarray, step: int = 1) -> np.ndarray:
    """``[sum length]`` int64: run j gives ``run_start[j] + step * (0, 1, ..., length[j] - 1)`` (step +-1).

    One repeat of the run offsets, then a ramp added in place: no loop over runs, no full-size temporary.
    Example starts [10, 50], lengths [2, 3], step 1 -> [10, 11, 50, 51, 52]; step -1 -> [10, 9, 50, 49, 48].
    """
    flat_start = np.add.accumulate(length) - length  # [R] first output index of each run
    out = np.repeat(run_start - flat_start if step > 0 else run_start + flat_start, length)
    ramp = np.add if step > 0 else np.subtract
    for i in range(0, out.shape[0], RAMP.shape[0]):  # cache-sized blocks: out[t] += step * t
        block = out[i : i + RAMP.shape[0]]
        ramp(block, RAMP[: block.shape[0]], out=block)
        if i:
            block += step * i
    return out


def offsets_within_key(key: np.ndarray, length: np.ndarray, key_totals: np.ndarray) -> np.ndarray:
    """``[R]`` int64: for each run j, the total ``length`` of the earlier runs with the same ``key``.

    ``key`` int64 ``[R]`` in ``[0, K)``, ``length`` int64 ``[R]``, ``key_totals`` = ``bincount(key,
    length)``, int64 ``[K]``. One stable sort by key (a radix sort for small keys), O(R).
    Example key [1, 0, 1, 1], length [2, 5, 3, 1] -> [0, 0, 2, 5].
    """
    sort_key = key.astype(np.int16) if key_totals.shape[0] <= _INT16_MAX else key
    order = np.argsort(sort_key, kind="stable")
    sorted_len = length[order]
    key_start = np.add.accumulate(key_totals) - key_totals
    out = np.empty_like(length)
    out[order] = np.add.accumulate(sorted_len) - sorted_len - key_start[key[order]]
    return out


def indptr(counts: np.ndarray) -> np.ndarray:
    """``[n + 1]`` int64 cumulative counts starting at 0 (CSR offsets): [2, 0, 3] -> [0, 2, 2, 5]."""
    out = np.zeros(counts.shape[0] + 1, dtype=_I64)
    np.add.accumulate(counts, out=out[1:])
    return out
