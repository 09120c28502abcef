"""``read_slots`` / ``write_slots`` / ``owned_mask`` kernels (interpreted on the CPU) equal ``SharedKVLayout``
on numpy arrays, bit for bit, for every integer dtype (SPEC C-LAYOUT, C-KERNEL)."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpkv import SharedKVLayout
from cpkv import kernels as K
from cpkv.errors import KernelError, LayoutError
from kernel_cases import SLOT_DTYPES, check_translations, layouts_and_slots

pytest.importorskip("triton", reason="Triton is not installed: `pip install -e '.[gpu]'` (make test does)")
pytestmark = [pytest.mark.unit, pytest.mark.clause("C-KERNEL")]

SPEC_SLOTS = [0, 63, 64, 65, 128, 197, 512, -1]


@pytest.mark.clause("C-LAYOUT")
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
def test_spec_example(dtype, launches):
    # C=4, P=64, Q=8 (SPEC section 3): slot 197 is page 3 offset 5 -> lane 3, write (3 // 4) * 64 + 5 = 5,
    # read (3*8 + 0)*64 + 5 = 1541; slot 512 is page 8 -> lane 0, local page 2: write 128, read 128.
    layout = SharedKVLayout(4, 64, 8)
    slots = torch.tensor(SPEC_SLOTS, dtype=dtype)
    assert K.read_slots(layout, slots).tolist() == [0, 63, 512, 513, 1024, 1541, 128, -1]
    assert K.write_slots(layout, slots).tolist() == [0, 63, 0, 1, 0, 5, 128, -1]
    assert K.owned_mask(layout, slots, 2).tolist() == [False, False, False, False, True, False, False, False]
    assert launches["translate_slots_kernel"] == 3


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=layouts_and_slots(), dtype=st.sampled_from(SLOT_DTYPES), use_out=st.booleans())
def test_random_slots_equal_the_numpy_reference(case, dtype, use_out):
    layout, slots = case
    check_translations(layout, slots, dtype, "cpu", use_out)


def test_int64_runs_the_kernel_for_every_translation(launches):
    layout = SharedKVLayout(3, 5, 7)
    slots = torch.arange(-2, layout.num_slots).reshape(1, -1)
    for name in ("read_slots", "write_slots"):
        assert np.array_equal(getattr(K, name)(layout, slots).numpy(), getattr(layout, name)(slots.numpy()))
    assert np.array_equal(K.owned_mask(layout, slots, 1).numpy(), layout.owned_mask(slots.numpy(), 1))
    assert launches["translate_slots_kernel"] == 3


def test_a_dtype_too_narrow_for_the_pool_takes_the_reference(launches):
    # int8 cannot hold every read slot of a 4*8*64-slot pool: the reference decides (and raises on overflow).
    layout = SharedKVLayout(4, 64, 8)
    small = torch.tensor([0, 5, 63, -1], dtype=torch.int8)
    assert K.write_slots(layout, small).tolist() == [0, 5, 63, -1]
    with pytest.raises(LayoutError, match="does not fit dtype"):
        K.read_slots(layout, torch.tensor([64], dtype=torch.int8))
    assert launches["translate_slots_kernel"] == 0


def test_out_of_range_slots_and_ranks_raise_the_references_errors():
    layout = SharedKVLayout(4, 64, 8)
    with pytest.raises(LayoutError, match="slot 2048 out of range: the pool has 2048 slots"):
        K.read_slots(layout, torch.tensor([0, 2048]))
    with pytest.raises(LayoutError, match=r"rank=4 out of range \[0, 4\)"):
        K.owned_mask(layout, torch.tensor([0]), 4)
    with pytest.raises(LayoutError, match="integer dtype"):
        K.write_slots(layout, torch.tensor([0.0]))


def test_bad_arguments_raise_kernel_error():
    layout = SharedKVLayout(4, 64, 8)
    with pytest.raises(KernelError, match="slots must be a torch tensor, got ndarray"):
        K.read_slots(layout, np.array([0]))
    with pytest.raises(KernelError, match=r"out must be a contiguous torch.int64 tensor of shape \[3\]"):
        K.read_slots(layout, torch.tensor([0, 1, 2]), out=torch.empty(4, dtype=torch.int64))
    with pytest.raises(KernelError, match=r"out must be a contiguous torch.bool tensor"):
        K.owned_mask(layout, torch.tensor([0, 1]), 0, out=torch.empty(2, dtype=torch.int64))
    with pytest.raises(KernelError, match="layout must be a SharedKVLayout"):
        K.read_slots((4, 64, 8), torch.tensor([0]))


def test_non_contiguous_slots_and_empty_tensors():
    layout = SharedKVLayout(2, 3, 5)
    slots = torch.arange(0, 30).reshape(5, 6).t()  # a transposed view
    assert np.array_equal(K.read_slots(layout, slots).numpy(), layout.read_slots(slots.numpy()))
    empty = torch.empty(0, dtype=torch.int32)
    assert K.write_slots(layout, empty).shape == (0,) and K.owned_mask(layout, empty, 0).dtype == torch.bool
