"""SPEC section 3 (C-LAYOUT) worked example and errors."""

import numpy as np
import pytest
import torch

from cpkv import LayoutError, SharedKVLayout

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-LAYOUT")]

SLOTS = [0, 63, 64, 65, 128, 197, 512, -1]
READ = [0, 63, 512, 513, 1024, 1541, 128, -1]
WRITE = [0, 63, 0, 1, 0, 5, 128, -1]
OWNED_BY_2 = [False, False, False, False, True, False, False, False]


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_spec_example_numpy(dtype):
    layout = SharedKVLayout(4, 64, 8)
    s = np.asarray(SLOTS, dtype=dtype)
    for fn, expected in ((layout.read_slots, READ), (layout.write_slots, WRITE)):
        out = fn(s)
        assert isinstance(out, np.ndarray) and out.dtype == dtype and out.tolist() == expected
    assert layout.owned_mask(s, 2).tolist() == OWNED_BY_2
    # lane of slot 197: page 3 -> lane 3; -1 passes through
    assert layout.lane_of(s).tolist() == [0, 0, 1, 1, 2, 3, 0, -1]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
def test_spec_example_torch(dtype):
    layout = SharedKVLayout(4, 64, 8)
    s = torch.tensor(SLOTS, dtype=dtype)
    out = layout.read_slots(s)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == s.device
    assert out.tolist() == READ
    assert layout.write_slots(s).tolist() == WRITE
    assert layout.owned_mask(s, 2).tolist() == OWNED_BY_2


def test_sizes_and_errors():
    layout = SharedKVLayout(4, 64, 8)
    assert (layout.num_slots, layout.lane_slots) == (2048, 512)
    with pytest.raises(LayoutError, match="slot 2048 out of range"):
        layout.read_slots(np.array([2048]))
    with pytest.raises(LayoutError, match="integer dtype"):
        layout.write_slots(np.array([1.5]))
    with pytest.raises(LayoutError, match="rank=4 out of range"):
        layout.owned_mask(np.array([0]), 4)
    with pytest.raises(LayoutError, match="does not fit dtype"):
        SharedKVLayout(4, 64, 1024).read_slots(np.array([64], dtype=np.int16))  # -> 65536


def test_sequences_must_hold_integers():
    layout = SharedKVLayout(4, 64, 8)
    assert layout.read_slots([64, -1]).tolist() == [512, -1]
    assert layout.read_slots([]).tolist() == []
    for bad in ([64.9], ["65"]):
        with pytest.raises(LayoutError, match="integer dtype"):
            layout.read_slots(bad)
    for rank in (-1, 4):
        with pytest.raises(LayoutError, match=f"rank={rank} out of range"):
            layout.owned_mask([0], rank)
    with pytest.raises(LayoutError, match="rank must be an integer, got True"):  # a bool, not a lane
        layout.owned_mask([0], True)
