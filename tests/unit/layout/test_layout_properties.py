"""Property tests: SharedKVLayout translations against the independent oracle (tests/oracle.py), SPEC C-LAYOUT.

numpy arrays of several integer dtypes and torch tensors; the result keeps the input's type, dtype,
device and shape, and negative slots (the -1 padding sentinel) pass through unchanged.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import SharedKVLayout
from cpkv.errors import LayoutError

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=150, deadline=None)

NP_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
TORCH_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


def fits(max_value: int, signed: bool, dtype) -> bool:
    info = np.iinfo(dtype) if not isinstance(dtype, torch.dtype) else torch.iinfo(dtype)
    return info.max >= max_value and (info.min < 0 or not signed)


@st.composite
def layout_cases(draw, dtypes):
    """(C, P, Q, dtype, slots list): slots in [0, C*Q*P) plus negatives where the dtype is signed."""
    C = draw(st.integers(1, 16))
    P = draw(st.one_of(st.sampled_from([1, 2, 64]), st.integers(1, 256)))
    Q = draw(st.integers(1, 64))
    n_slots = C * Q * P
    with_negatives = draw(st.booleans())
    dtype = draw(st.sampled_from([d for d in dtypes if fits(n_slots - 1, with_negatives, d)]))
    pool = st.integers(0, n_slots - 1)
    elem = st.one_of(pool, st.sampled_from([-1, -7, -(2**7)])) if with_negatives else pool
    slots = draw(st.lists(elem, min_size=0, max_size=64))
    return C, P, Q, dtype, slots


def expected(slots, C, P, Q, rank):
    return dict(
        lane=[oracle.lane_of(s, C, P) for s in slots],
        write=[oracle.write_slot(s, C, P) for s in slots],
        read=[oracle.read_slot(s, C, P, Q) for s in slots],
        owned=[oracle.owned(s, rank, C, P) for s in slots],
    )


@pytest.mark.clause("C-LAYOUT")
@SETTINGS
@given(layout_cases(NP_DTYPES), st.data())
def test_numpy_translations_match_oracle(case, data):
    C, P, Q, dtype, slots = case
    rank = data.draw(st.integers(0, C - 1))
    layout = SharedKVLayout(C, P, Q)
    x = np.asarray(slots, dtype=dtype)
    x_before = x.copy()
    want = expected(slots, C, P, Q, rank)
    outs = {"lane": layout.lane_of(x), "write": layout.write_slots(x), "read": layout.read_slots(x)}
    for name, out in outs.items():
        assert isinstance(out, np.ndarray)
        assert out.dtype == x.dtype and out.shape == x.shape
        assert out.tolist() == want[name], name
    mask = layout.owned_mask(x, rank)
    assert isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == x.shape
    assert mask.tolist() == want["owned"]
    np.testing.assert_array_equal(x, x_before)  # input left alone


@pytest.mark.clause("C-LAYOUT")
@SETTINGS
@given(layout_cases(TORCH_DTYPES), st.data())
def test_torch_translations_match_oracle(case, data):
    C, P, Q, dtype, slots = case
    rank = data.draw(st.integers(0, C - 1))
    layout = SharedKVLayout(C, P, Q)
    x = torch.tensor(slots, dtype=dtype)
    want = expected(slots, C, P, Q, rank)
    outs = {"lane": layout.lane_of(x), "write": layout.write_slots(x), "read": layout.read_slots(x)}
    for name, out in outs.items():
        assert isinstance(out, torch.Tensor)
        assert out.dtype == x.dtype and out.device == x.device and out.shape == x.shape
        assert out.tolist() == want[name], name
    mask = layout.owned_mask(x, rank)
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.device == x.device
    assert mask.tolist() == want["owned"]


@pytest.mark.clause("C-LAYOUT")
@SETTINGS
@given(st.integers(1, 8), st.integers(1, 16), st.integers(1, 8))
def test_read_view_is_lane_major_bijection(C, P, Q):
    # Every pool slot maps to a distinct read row; read row = lane * Q * P + write row, write row < Q * P.
    layout = SharedKVLayout(C, P, Q)
    slots = np.arange(C * Q * P, dtype=np.int64)
    read, write, lane = layout.read_slots(slots), layout.write_slots(slots), layout.lane_of(slots)
    assert sorted(read.tolist()) == slots.tolist()
    np.testing.assert_array_equal(read, lane * Q * P + write)
    assert ((write >= 0) & (write < Q * P)).all()
    for r in range(C):
        owned = layout.owned_mask(slots, r)
        assert sorted(write[owned].tolist()) == list(range(Q * P))  # each lane's segment is filled once


@pytest.mark.clause("C-LAYOUT")
def test_spec_example_and_2d_shape():
    # SPEC section 3: C=4, P=64, Q=8 (the oracle's answers are pinned in test_oracle_examples.py).
    layout = SharedKVLayout(4, 64, 8)
    slots = np.array([[0, 63, 64, 65], [128, 197, 512, -1]], dtype=np.int32)
    assert layout.read_slots(slots).tolist() == [[0, 63, 512, 513], [1024, 1541, 128, -1]]
    assert layout.write_slots(slots).tolist() == [[0, 63, 0, 1], [0, 5, 128, -1]]
    assert layout.owned_mask(slots, 2).tolist() == [[False, False, False, False], [True, False, False, False]]
    t = torch.tensor(slots)
    assert layout.read_slots(t).tolist() == [[0, 63, 512, 513], [1024, 1541, 128, -1]]
    assert layout.read_slots(t).dtype == torch.int32


@pytest.mark.clause("C-LAYOUT")
def test_slot_outside_pool_and_bad_rank():
    layout = SharedKVLayout(4, 64, 8)  # 2048 slots
    with pytest.raises(LayoutError, match="2048"):
        layout.read_slots(np.array([0, 2048], dtype=np.int64))
    with pytest.raises(LayoutError, match="4"):
        layout.owned_mask(np.array([0]), 4)
