"""``out=`` of the SharedKVLayout translations (SPEC C-LAYOUT): the result written into a preallocated
array or tensor equals the fresh result (and the oracle), and a bad ``out`` is a typed LayoutError."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import LayoutError, SharedKVLayout

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-LAYOUT")]

OPS = {"read_slots": oracle.read_slot, "write_slots": oracle.write_slot, "lane_of": oracle.lane_of}


def want(op, slots, C, P, Q):
    fn = OPS[op]
    return [fn(s, C, P, Q) if op == "read_slots" else fn(s, C, P) for s in slots]


@settings(max_examples=100, deadline=None)
@given(
    C=st.integers(1, 9),
    P=st.sampled_from([1, 3, 64]),
    Q=st.integers(1, 40),
    op=st.sampled_from(sorted(OPS)),
    dtype=st.sampled_from(["int64", "int32"]),
    as_torch=st.booleans(),
    data=st.data(),
)
def test_out_equals_fresh_result_and_oracle(C, P, Q, op, dtype, as_torch, data):
    layout = SharedKVLayout(C, P, Q)
    slots = data.draw(st.lists(st.integers(0, C * Q * P - 1) | st.just(-1), min_size=0, max_size=80))
    x = np.asarray(slots, dtype=dtype)
    if as_torch:
        x = torch.from_numpy(x)
    out = torch.full_like(x, 7) if as_torch else np.full_like(x, 7)  # stale contents must be overwritten
    got = getattr(layout, op)(x, out=out)
    assert got is out
    assert out.tolist() == want(op, slots, C, P, Q) == getattr(layout, op)(x).tolist()


@pytest.mark.parametrize("op", sorted(OPS))
def test_out_over_many_blocks_and_2d(op, monkeypatch):
    # Several kernel blocks (a small block size), a 2-D shape, negatives in every block.
    import cpkv.layout as layout_mod

    monkeypatch.setattr(layout_mod, "_BLOCK", 64)
    C, P, Q = 4, 8, 50
    layout = SharedKVLayout(C, P, Q)
    slots = np.random.default_rng(0).integers(0, C * Q * P, (30, 41), dtype=np.int64)
    slots[:, ::7] = -1
    out = np.empty_like(slots)
    assert getattr(layout, op)(slots, out=out) is out
    flat = slots.ravel().tolist()
    assert out.ravel().tolist() == want(op, flat, C, P, Q)


def test_out_from_a_python_sequence_and_fallback_paths():
    layout = SharedKVLayout(4, 64, 8)
    out = np.empty(3, dtype=np.int64)
    assert layout.read_slots([64, -1, 197], out=out) is out and out.tolist() == [512, -1, 1541]
    # int16 slots of a 262,144-slot pool: the kernel's int32 result at the -1 is 3 * 64 * 1024 - 1, beyond
    # int16, so it hands over to the formula path, whose result (-1 passes through) must land in out.
    x = np.array([1, -1], dtype=np.int16)
    out16 = np.empty(2, dtype=np.int16)
    assert SharedKVLayout(4, 64, 1024).read_slots(x, out=out16) is out16 and out16.tolist() == [1, -1]


@pytest.mark.parametrize(
    ("make_out", "match"),
    [
        (lambda x: np.empty(4, dtype=np.int32), r"out is int32 \(4,\), but slots are int64 \(4,\)"),
        (lambda x: np.empty(5, dtype=np.int64), r"out is int64 \(5,\)"),
        (lambda x: np.empty((4, 2), dtype=np.int64)[:, 0], "C-contiguous"),
        (lambda x: torch.empty(4, dtype=torch.int64), "out must be a numpy array like slots, got Tensor"),
        (lambda x: x, "shares memory with slots"),
        (lambda x: [0, 0, 0, 0], "out must be a numpy array"),
    ],
)
def test_bad_numpy_out_is_a_layout_error(make_out, match):
    layout = SharedKVLayout(4, 64, 8)
    x = np.array([0, 64, 128, -1], dtype=np.int64)
    before = x.copy()
    with pytest.raises(LayoutError, match=match):
        layout.read_slots(x, out=make_out(x))
    assert np.array_equal(x, before)
    ro = np.empty(4, dtype=np.int64)
    ro.setflags(write=False)
    with pytest.raises(LayoutError, match="writable"):
        layout.write_slots(x, out=ro)


def test_bad_torch_out_is_a_layout_error():
    layout = SharedKVLayout(4, 64, 8)
    x = torch.tensor([0, 64, 128, -1])
    with pytest.raises(LayoutError, match=r"out is torch.int32 \(4,\) on cpu, but slots are torch.int64"):
        layout.read_slots(x, out=torch.empty(4, dtype=torch.int32))
    with pytest.raises(LayoutError, match="out must be a torch tensor like slots, got ndarray"):
        layout.read_slots(x, out=np.empty(4, dtype=np.int64))
    with pytest.raises(LayoutError, match="contiguous"):
        layout.read_slots(x, out=torch.empty(4, 2, dtype=torch.int64)[:, 0])
    with pytest.raises(LayoutError, match="shares memory"):
        layout.lane_of(x, out=x)


def test_out_with_a_bad_slot_raises_as_without_out():
    layout = SharedKVLayout(4, 64, 8)
    with pytest.raises(LayoutError, match="slot 2048 out of range"):
        layout.read_slots(np.array([0, 2048]), out=np.empty(2, dtype=np.int64))
    with pytest.raises(LayoutError, match="does not fit dtype"):
        SharedKVLayout(4, 64, 1024).read_slots(np.array([64], dtype=np.int16), out=np.empty(1, np.int16))
