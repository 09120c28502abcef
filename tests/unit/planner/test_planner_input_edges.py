"""Planner input edges: bools, float scalars, tensors without data are typed errors naming the input."""

import numpy as np
import pytest
import torch

from cpkv import CPConfig, PlanError, plan_batch, plan_request

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-FAIL-FAST")]

CFG = CPConfig(4, 64, "rotation")


@pytest.mark.parametrize(
    ("prefix_lens", "extend_lens", "message"),
    [
        ([True, 0], [5, 5], r"prefix_lens\[0\] is a bool \(True\)"),
        ([0, 0], [5, False], r"extend_lens\[1\] is a bool \(False\)"),
        ([np.True_], [5], r"prefix_lens\[0\] is a bool \(True\)"),
        (np.array([True]), [5], "prefix_lens must hold integers, got dtype bool"),
        (torch.tensor([True]), [5], "prefix_lens must hold integers, got dtype bool"),
    ],
)
def test_plan_batch_rejects_bools(prefix_lens, extend_lens, message):
    with pytest.raises(PlanError, match=message):
        plan_batch(prefix_lens, extend_lens, CFG)


def test_plan_batch_rejects_bool_head_owners_and_phases():
    with pytest.raises(PlanError, match=r"head_owners\[0\] is a bool"):
        plan_batch([100], [5], CFG, head_owners=[True])
    with pytest.raises(PlanError, match=r"phases\[0\] is a bool"):
        plan_batch([0], [5], CFG, phases=[True])


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((100.0, 5), {}, r"^prefix_len must be an integer, got 100\.0$"),
        ((0, 5.0), {}, r"^extend_len must be an integer, got 5\.0$"),
        ((True, 5), {}, r"^prefix_len must be an integer, got True$"),
        ((100, 5), {"head_owner": 1.0}, r"^head_owner must be an integer or None, got 1\.0$"),
        ((0, 5), {"phase": "1"}, r"^phase must be an integer or None, got '1'$"),
    ],
)
def test_plan_request_names_the_singular_argument(args, kwargs, message):
    with pytest.raises(PlanError, match=message):
        plan_request(*args, CFG, **kwargs)


def test_plan_request_accepts_numpy_and_tensor_scalars():
    a = plan_request(np.int64(100), torch.tensor(200), CFG, head_owner=np.int32(1))
    assert (a.phase, a.page_owners.tolist()) == (1, [1, 2, 3])


@pytest.mark.parametrize("device_tensor", [torch.zeros(2, dtype=torch.int64, device="meta")])
def test_meta_tensor_is_a_plan_error(device_tensor):
    with pytest.raises(PlanError, match="prefix_lens is a tensor on device meta"):
        plan_batch(device_tensor, [5, 5], CFG)
    with pytest.raises(PlanError, match="extend_lens is a tensor on device meta"):
        plan_batch([0, 0], device_tensor, CFG)


def test_tensor_dtype_numpy_cannot_hold_is_a_plan_error():
    with pytest.raises(PlanError, match="prefix_lens must hold integers, got dtype torch.bfloat16"):
        plan_batch(torch.zeros(2, dtype=torch.bfloat16), [5, 5], CFG)
