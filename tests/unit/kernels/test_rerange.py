"""``all_gather_rerange`` and its inverse (interpreted on the CPU) equal numpy indexing by the plan's
``gather_index``, bit for bit, and follow the plan's owners, not the zigzag ranks (SPEC C-GATHER, C-KERNEL)."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import oracle
from cpkv import CPConfig, plan_batch
from cpkv import kernels as K
from cpkv.errors import KernelError
from kernel_cases import ROW_DTYPES, Batch, batches, bits, check_rerange, random_rows

pytest.importorskip("triton", reason="Triton is not installed: `pip install -e '.[gpu]'` (make test does)")
pytestmark = [pytest.mark.unit, pytest.mark.clause("C-KERNEL")]

SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _batch(plan) -> Batch:
    return Batch(plan, np.full(plan.num_requests, -1), np.arange(plan.page_owners.shape[0]))


@pytest.mark.clause("C-GATHER")
def test_hand_computed_rerange_with_phase_one(launches):
    # C=2, P=1, L0=0, E=5, phase 1: segments [1,1,1,1] (+1 page to segment 0) -> zigzag ranks z = [0,0,1,1,0]
    # shifted by the phase: owners [1,1,0,0,1]; M = 3; rank 0 holds tokens 2,3 and rank 1 tokens 0,1,4.
    # gather_index = [1*3+0, 1*3+1, 0*3+0, 0*3+1, 1*3+2] = [3, 4, 0, 1, 5].
    plan = plan_batch([0], [5], CPConfig(2, 1), phases=[1])
    assert plan.token_owner.tolist() == [1, 1, 0, 0, 1] and plan.gather_index.tolist() == [3, 4, 0, 1, 5]
    gathered = torch.tensor([[20.0], [30.0], [-1.0], [0.0], [10.0], [40.0]])  # row r*M+i: rank r's i-th token
    assert K.all_gather_rerange(gathered, plan).flatten().tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    flat = torch.tensor([[0.0], [10.0], [20.0], [30.0], [40.0]])
    assert K.all_gather_rerange_inverse(flat, plan).flatten().tolist() == [20.0, 30.0, 0.0, 0.0, 10.0, 40.0]
    assert launches["copy_runs_kernel"] == 2


@pytest.mark.clause("C-GATHER")
@pytest.mark.parametrize("phase", [0, 1, 2, 3])
def test_owners_come_from_the_plan_not_from_the_zigzag_rank(phase):
    # Under a non-zero phase (and with a head run owned by lane 2), a rerange that assumed segment s on rank
    # z(s) would read other rows: the phase-0 oracle's gather index differs from the plan's.
    cfg = CPConfig(4, 4)
    plan = plan_batch([6, 0], [37, 20], cfg, head_owners=[2, None], phases=[phase, (phase + 1) % 4])
    naive = oracle.plan_batch([6, 0], [37, 20], 4, 4, head_owners=[2, None], phases=[0, 0])
    if phase:
        assert naive["gather_index"] != plan.gather_index.tolist()
    gathered = random_rows(4 * plan.max_rank_tokens, 3, torch.float32, seed=phase, device="cpu")
    assert np.array_equal(bits(K.all_gather_rerange(gathered, plan)), bits(gathered)[plan.gather_index])


@pytest.mark.clause("C-GATHER")
@SETTINGS
@given(
    batch=batches(),
    width=st.sampled_from([1, 3, 8, 128]),
    dtype=st.sampled_from(ROW_DTYPES),
    seed=st.integers(0, 99),
)
def test_random_batches_equal_the_numpy_reference(batch, width, dtype, seed):
    check_rerange(batch, width, dtype, "cpu", seed, use_out=bool(seed % 2))


@pytest.mark.clause("C-GATHER")
@settings(max_examples=8, deadline=None)
@given(
    batch=batches(max_tokens=600),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 99),
)
def test_latent_rows_576_wide(batch, dtype, seed):
    check_rerange(batch, 576, dtype, "cpu", seed)


def test_balanced_policy_batch_many_column_blocks(launches):
    # 6 requests under explicit phases, index-key rows (128 wide, bf16) and 300-wide int32 rows.
    plan = plan_batch(
        [0, 64, 100, 7, 0, 5],
        [700, 1, 90, 0, 33, 400],
        CPConfig(8, 64, "balanced"),
        head_owners=[None, None, 3, 1, None, 6],
        phases=[5, 2, 7, 0, 1, 4],
    )
    check_rerange(_batch(plan), 128, torch.bfloat16, "cpu", seed=1)
    check_rerange(_batch(plan), 300, torch.int32, "cpu", seed=2, use_out=True)
    assert launches["copy_runs_kernel"] == 4


def test_empty_batch_and_zero_width():
    plan = plan_batch([0, 3], [0, 0], CPConfig(4, 8), head_owners=[None, 1])
    assert plan.max_rank_tokens == 0
    assert K.all_gather_rerange(torch.empty(0, 576), plan).shape == (0, 576)
    assert K.all_gather_rerange_inverse(torch.empty(0, 128), plan).shape == (0, 128)
    plan = plan_batch([0], [5], CPConfig(2, 1))
    assert K.all_gather_rerange(torch.empty(6, 0), plan).shape == (5, 0)


def test_strided_rows_are_read_correctly():
    plan = plan_batch([0], [9], CPConfig(3, 2))
    wide = random_rows(3 * plan.max_rank_tokens, 10, torch.float32, seed=5, device="cpu")
    view = wide[:, 2:7]  # rows contiguous, row stride 10
    assert np.array_equal(bits(K.all_gather_rerange(view, plan)), bits(view)[plan.gather_index])


def test_bad_shapes_raise_kernel_error():
    plan = plan_batch([0], [5], CPConfig(2, 1))  # M = 3, C*M = 6
    with pytest.raises(KernelError, match=r"gathered must be 2-D with 6 rows .* got shape \[5, 4\]"):
        K.all_gather_rerange(torch.zeros(5, 4), plan)
    with pytest.raises(KernelError, match=r"flat must be 2-D with 5 rows .* got shape \[5\]"):
        K.all_gather_rerange_inverse(torch.zeros(5), plan)
    with pytest.raises(KernelError, match=r"out must be a contiguous torch.float32 tensor of shape \[5, 4\]"):
        K.all_gather_rerange(torch.zeros(6, 4), plan, out=torch.zeros(5, 4, dtype=torch.bfloat16))
    with pytest.raises(KernelError, match="gathered must be a torch tensor"):
        K.all_gather_rerange(np.zeros((6, 4)), plan)
