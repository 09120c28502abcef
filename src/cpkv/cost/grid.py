"""Monotone piecewise-linear price tables sampled from measured latencies (SPEC C-COST).

Measured operator tables are noisy: a kernel timed at 16 tokens can read slower than at 32. A price that
falls when the work grows would let a busier rank finish first, so every table is made nondecreasing
along each axis before use (``monotone``) and interpolated piecewise-linearly, which keeps it so:
``Curve`` over one size, ``Surface`` over two (queries x keys, batch x context). Past the last sample a
table continues along the slope of its last segment (never negative), so it stays monotone there too.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def monotone(z: np.ndarray) -> np.ndarray:
    """``z`` made nondecreasing along every axis: the mean of its upper envelope (running max from the
    low end of each axis in turn) and its lower envelope (running min from the high end). Where ``z`` is
    already nondecreasing it is returned unchanged; elsewhere a dip is filled half-way. float64, same shape.
    """
    up = lo = np.asarray(z, dtype=np.float64)
    for axis in range(up.ndim):
        up = np.maximum.accumulate(up, axis=axis)
        lo = np.flip(np.minimum.accumulate(np.flip(lo, axis), axis=axis), axis)
    return (up + lo) / 2


def _check_axis(name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or x.shape[0] < 2 or not np.all(np.diff(x) > 0):
        raise ValueError(f"{name} must be a strictly increasing 1-D grid of >= 2 points, got {x!r}")
    return x


class Curve:
    """A nondecreasing piecewise-linear price ``y(x)`` (ms) of one size ``x`` (tokens, bytes, requests).

    Args:
        x: float ``[n]`` strictly increasing sample points. y: float ``[n]`` latencies at them (made
            monotone with ``monotone``). Below ``x[0]`` the price is ``y[0]``; past ``x[-1]`` it grows
            along the last segment's slope.
    """

    def __init__(self, x: np.ndarray, y: ArrayLike) -> None:
        self.x = _check_axis("x", x)
        self.y = monotone(np.asarray(y, dtype=np.float64).reshape(self.x.shape))
        self.tail = (self.y[-1] - self.y[-2]) / (self.x[-1] - self.x[-2])  # >= 0
        self._xs, self._ys = self.x.tolist(), self.y.tolist()
        self._memo: dict[int, float] = {}

    def __call__(self, q: np.ndarray) -> np.ndarray:
        """Prices at ``q`` (any shape), float64 ms."""
        q = np.asarray(q, dtype=np.float64)
        return np.interp(q, self.x, self.y) + np.maximum(q - self.x[-1], 0.0) * self.tail

    def at(self, q: int) -> float:
        """The price at one integer size, memoised (a replay asks the same sizes over and over)."""
        v = self._memo.get(q)
        if v is None:
            xs, ys = self._xs, self._ys
            i = bisect_right(xs, q) - 1
            if i < 0:
                v = ys[0]
            elif i >= len(xs) - 1:
                v = ys[-1] + (q - xs[-1]) * self.tail
            else:
                v = ys[i] + (q - xs[i]) * (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
            if len(self._memo) < 1 << 16:
                self._memo[q] = v
        return v


class Surface:
    """A price ``z(x, y)`` (ms) nondecreasing in both sizes: bilinear inside the sampled grid, and past its
    last row or column growing along that edge's slope (made nondecreasing along the other axis), so the
    price stays monotone in both sizes everywhere.

    Args:
        x: float ``[nx]`` and y: float ``[ny]`` strictly increasing sample points. z: float ``[nx, ny]``
            latencies (made monotone with ``monotone``). Below the first point of an axis the price is that
            of the first point.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> None:
        self.x, self.y = _check_axis("x", x), _check_axis("y", y)
        self.z = monotone(np.asarray(z, dtype=np.float64).reshape(self.x.shape[0], self.y.shape[0]))
        self._dx, self._dy = np.diff(self.x), np.diff(self.y)
        # Slopes past the last column / row, as functions of the other size: cumulative max keeps them
        # nondecreasing, so the extended price stays monotone in that size too.
        self._tail_x = np.maximum.accumulate((self.z[-1] - self.z[-2]) / self._dx[-1])  # [ny]
        self._tail_y = np.maximum.accumulate((self.z[:, -1] - self.z[:, -2]) / self._dy[-1])  # [nx]

    @staticmethod
    def _cell(axis: np.ndarray, step: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = axis.searchsorted(q, side="right") - 1
        np.minimum(i, axis.shape[0] - 2, out=i)
        np.maximum(i, 0, out=i)
        t = (q - axis[i]) / step[i]
        np.minimum(t, 1.0, out=t)
        return i, np.maximum(t, 0.0, out=t)

    def __call__(self, qx: ArrayLike, qy: ArrayLike) -> np.ndarray:
        """Prices at the points ``(qx[k], qy[k])`` (equal shapes, or scalars), float64 ms of that shape."""
        shape = np.shape(qx)
        qx = np.atleast_1d(np.asarray(qx, dtype=np.float64))
        qy = np.atleast_1d(np.asarray(qy, dtype=np.float64))
        i, tx = self._cell(self.x, self._dx, qx)
        j, ty = self._cell(self.y, self._dy, qy)
        z = self.z
        z00, z01 = z[i, j], z[i, j + 1]
        lo = z00 + (z[i + 1, j] - z00) * tx
        out = lo + (z01 + (z[i + 1, j + 1] - z01) * tx - lo) * ty
        if qx.max(initial=0.0) > self.x[-1]:
            out += np.maximum(qx - self.x[-1], 0.0) * np.interp(qy, self.y, self._tail_x)
        if qy.max(initial=0.0) > self.y[-1]:
            out += np.maximum(qy - self.y[-1], 0.0) * np.interp(qx, self.x, self._tail_y)
        return out.reshape(shape)
