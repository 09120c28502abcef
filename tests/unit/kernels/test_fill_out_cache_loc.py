"""``fill_out_cache_loc`` (Triton, interpreted on the CPU) equals the numpy reference and the oracle (C-KERNEL)."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from cpkv import CPConfig, plan_batch
from cpkv import kernels as K
from cpkv.errors import KernelError
from kernel_cases import Batch, batches, check_fill_out_cache_loc

pytest.importorskip("triton", reason="Triton is not installed: `pip install -e '.[gpu]'` (make test does)")
pytestmark = [pytest.mark.unit, pytest.mark.clause("C-KERNEL")]


@pytest.mark.clause("C-ALLOC")
def test_spec_example_with_a_head_run_and_a_short_last_page(launches):
    # C=2, P=4. Request 0: L0=10, E=8, last_loc 9 (slot of position 9, page 2 offset 1): head h = 4 - 2 = 2
    # tokens -> slots 10, 11; then 6 tokens on new pages [5, 2] -> 20..23, 8, 9 (the last page holds 2).
    # Request 1: L0=0, E=5 on pages [7, 3] -> 28..31, 12.
    plan = plan_batch([10, 0], [8, 5], CPConfig(2, 4), head_owners=[0, None])
    got = K.fill_out_cache_loc(plan, [9, -1], [5, 2, 7, 3])
    assert got.tolist() == [10, 11, 20, 21, 22, 23, 8, 9, 28, 29, 30, 31, 12]
    assert launches["fill_out_cache_loc_kernel"] == 1  # one launch for the whole batch


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches())
def test_random_batches_equal_the_numpy_reference(batch, launches):
    before = launches["fill_out_cache_loc_kernel"]  # the counter lives across hypothesis examples
    check_fill_out_cache_loc(batch, "cpu", use_out=bool(batch.plan.num_tokens % 2))
    assert launches["fill_out_cache_loc_kernel"] - before == (1 if batch.plan.num_tokens else 0)


def test_many_blocks_and_runs():
    # 40 requests (more runs than a few binary-search steps), 3000+ tokens over several 1024-token programs.
    rng = np.random.default_rng(3)
    L0 = rng.integers(0, 300, 40)
    E = rng.integers(0, 160, 40)
    plan = plan_batch(L0, E, CPConfig(16, 7), head_owners=rng.integers(0, 16, 40))
    pages = rng.permutation(plan.page_owners.shape[0]) + 1
    last = np.where(L0 > 0, 7 * rng.integers(1, 99, 40) + (L0 - 1) % 7, -1)
    assert plan.token_runs.length.shape[0] > 100 and plan.num_tokens > 3000
    check_fill_out_cache_loc(Batch(plan, last, pages), "cpu")


def test_blocks_inside_one_run_and_blocks_across_runs():
    # The kernel finds one run per block when the block's first and last token share it, else one per
    # token: a head run of 11 tokens, then segments of ~2,250 tokens give blocks of each kind.
    from cpkv.kernels.slots import _BLOCK, fill_table

    one = plan_batch([10], [8], CPConfig(1, 4), head_owners=[0])  # fill_table's docstring example
    assert fill_table(one, np.array([9]), np.array([5, 2])).tolist() == [
        0,
        2,
        6,
        8,
        10,
        -1,
        -2,
        0,
        2,
        0,
        10,
        5,
        2,
    ]
    plan = plan_batch([5, 0], [9000, 2100], CPConfig(2, 16), head_owners=[1, None])
    starts = np.cumsum(plan.token_runs.length) - plan.token_runs.length
    first = np.arange(0, plan.num_tokens, _BLOCK)
    last = np.minimum(first + _BLOCK, plan.num_tokens) - 1
    one_run = np.searchsorted(starts, first, "right") == np.searchsorted(starts, last, "right")
    assert one_run.any() and not one_run.all()
    pages = np.random.default_rng(5).permutation(plan.page_owners.shape[0]) + 3
    check_fill_out_cache_loc(Batch(plan, np.array([16 * 40 + 4, -1]), pages), "cpu")


def test_empty_batch_and_empty_requests():
    plan = plan_batch([0, 5], [0, 0], CPConfig(4, 64), head_owners=[None, 0])
    got = K.fill_out_cache_loc(plan, [-1, 68], [])
    assert got.shape == (0,) and got.dtype == torch.int64


def test_bad_inputs_raise_kernel_error_naming_the_value():
    plan = plan_batch([10], [8], CPConfig(2, 4), head_owners=[0])
    with pytest.raises(KernelError, match="new_pages has 1 entries but the plan has 2"):
        K.fill_out_cache_loc(plan, [9], [5])
    with pytest.raises(KernelError, match="last_locs has 2 entries but the plan has 1"):
        K.fill_out_cache_loc(plan, [9, 9], [5, 2])
    with pytest.raises(KernelError, match="request 0: computes head tokens but last_loc=-1"):
        K.fill_out_cache_loc(plan, [-1], [5, 2])
    with pytest.raises(KernelError, match=r"out must be a contiguous torch.int64 tensor of shape \[8\]"):
        K.fill_out_cache_loc(plan, [9], [5, 2], out=torch.empty(8, dtype=torch.int32))
    with pytest.raises(KernelError, match="plan must be a BatchPlan"):
        K.fill_out_cache_loc(plan.requests[0], [9], [5, 2])
