"""Monotone price tables (cpkv.cost.grid, SPEC C-COST): nondecreasing everywhere, exact where the samples are.

No aiconfigurator needed: the tables are built from made-up samples, checked against plain-Python references.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.cost.grid import Curve, Surface, monotone

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-COST")]

samples = st.lists(st.floats(0, 100, allow_nan=False), min_size=2, max_size=7)


def _axis(draw, n):
    steps = draw(st.lists(st.integers(1, 50), min_size=n, max_size=n))
    return np.cumsum(steps).astype(float) - steps[0]  # starts at 0, strictly increasing


@st.composite
def surfaces(draw):
    nx, ny = draw(st.integers(2, 6)), draw(st.integers(2, 6))
    x, y = _axis(draw, nx), _axis(draw, ny)
    z = np.array(draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=nx * ny, max_size=nx * ny)))
    return x, y, z.reshape(nx, ny)


def _nondecreasing(z: np.ndarray) -> bool:
    return all(np.all(np.diff(z, axis=a) >= -1e-9) for a in range(z.ndim))


@settings(max_examples=200, deadline=None)
@given(surfaces())
def test_monotone_is_nondecreasing_between_the_envelopes_and_keeps_monotone_input(xyz):
    _, _, z = xyz
    m = monotone(z)
    assert _nondecreasing(m)
    nx, ny = z.shape
    for i, j in itertools.product(range(nx), range(ny)):  # plain-Python envelopes of each cell
        up = max(z[a, b] for a in range(i + 1) for b in range(j + 1))
        lo = min(z[a, b] for a in range(i, nx) for b in range(j, ny))
        assert m[i, j] == pytest.approx((up + lo) / 2)
    already = np.cumsum(np.cumsum(np.abs(z), axis=0), axis=1)
    assert np.array_equal(monotone(already), already)


@settings(max_examples=200, deadline=None)
@given(samples, st.lists(st.integers(0, 400), min_size=1, max_size=20))
def test_curve_interpolates_the_monotone_samples_and_at_agrees(ys, queries):
    x = np.arange(len(ys), dtype=float) * 37.0
    c = Curve(x, ys)
    m = monotone(np.array(ys))
    assert np.allclose(c(x), m)
    for q in queries:  # plain linear interpolation, and the last segment's slope past the end
        i = min(int(q // 37), len(ys) - 2)
        ref = m[i] + (q - x[i]) * (m[i + 1] - m[i]) / 37.0
        assert c(q) == pytest.approx(ref, abs=1e-9)
        assert c.at(q) == pytest.approx(ref, abs=1e-9)
    qs = np.sort(np.array(queries, dtype=float))
    assert np.all(np.diff(c(qs)) >= -1e-9)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(surfaces(), st.data())
def test_surface_is_bilinear_inside_and_monotone_everywhere(xyz, data):
    x, y, z = xyz
    s = Surface(x, y, z)
    m = monotone(z)
    for i, j in itertools.product(range(len(x)), range(len(y))):
        assert s(x[i], y[j]) == pytest.approx(m[i, j])
    top_x, top_y = float(x[-1]) * 2 + 10, float(y[-1]) * 2 + 10  # well past the grid too
    pts = data.draw(st.lists(st.tuples(st.floats(0, top_x), st.floats(0, top_y)), min_size=2, max_size=12))
    for (ax, ay), (bx, by) in itertools.combinations(pts, 2):
        lo, hi = (min(ax, bx), min(ay, by)), (max(ax, bx), max(ay, by))
        assert s(*lo) <= s(*hi) + 1e-9  # componentwise larger sizes never cost less
    qx, qy = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    inside = (qx <= x[-1]) & (qy <= y[-1])
    for k in np.flatnonzero(inside):  # the textbook bilinear formula on the monotone grid
        i = min(np.searchsorted(x, qx[k], side="right") - 1, len(x) - 2)
        j = min(np.searchsorted(y, qy[k], side="right") - 1, len(y) - 2)
        tx, ty = (qx[k] - x[i]) / (x[i + 1] - x[i]), (qy[k] - y[j]) / (y[j + 1] - y[j])
        ref = (
            (1 - tx) * (1 - ty) * m[i, j]
            + tx * (1 - ty) * m[i + 1, j]
            + (1 - tx) * ty * m[i, j + 1]
            + tx * ty * m[i + 1, j + 1]
        )
        assert s(qx[k : k + 1], qy[k : k + 1])[0] == pytest.approx(ref, abs=1e-9)


def test_bad_axes_are_refused():
    with pytest.raises(ValueError, match="strictly increasing"):
        Curve([0, 0], [1, 2])
    with pytest.raises(ValueError, match="strictly increasing"):
        Surface([0, 1], [3], [[1], [2]])
