"""The Triton kernels compiled on a CUDA device equal the numpy reference bit for bit (SPEC C-KERNEL).

The same checks as tests/unit/kernels (which run them in Triton's CPU interpreter), with fewer distinct
page and cp sizes (each compiles its own kernel), plus sizes only a GPU makes quick (the bandwidth
figures at 1M-16M tokens are benchmarks/bench_kernels.py's). Skipped without CUDA.
"""

import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig, OwnerLaneAllocator, SharedKVLayout, plan_batch
from cpkv import kernels as K
from cpkv.kernels import backend
from kernel_cases import (
    ROW_DTYPES,
    SLOT_DTYPES,
    Batch,
    batches,
    check_fill_out_cache_loc,
    check_rerange,
    check_translations,
    layouts_and_slots,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.clause("C-KERNEL"),
    pytest.mark.timeout(600),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None,
        reason="needs Triton: pip install '.[gpu]' (a cpkv checkout)",
    ),
]

GPU_CP_SIZES = st.sampled_from([1, 2, 8, 16])
GPU_PAGE_SIZES = st.sampled_from([1, 7, 16, 64])
SETTINGS = settings(max_examples=40, deadline=None)


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    monkeypatch.delenv("CPKV_KERNELS", raising=False)


def test_cuda_takes_the_compiled_kernels():
    assert K.kernel_backend("cuda") == "triton"
    assert type(backend.kernel_module(False).copy_runs_kernel).__name__ == "JITFunction"


@SETTINGS
@given(batch=batches(cp_sizes=GPU_CP_SIZES, page_sizes=GPU_PAGE_SIZES, max_requests=8, max_tokens=20000))
def test_fill_out_cache_loc_random_batches(batch):
    check_fill_out_cache_loc(batch, "cuda", use_out=bool(batch.plan.num_tokens % 2))


@SETTINGS
@given(
    case=layouts_and_slots(cp_sizes=GPU_CP_SIZES, page_sizes=GPU_PAGE_SIZES, max_slots=50000),
    dtype=st.sampled_from(SLOT_DTYPES),
    use_out=st.booleans(),
)
def test_translations_random_slots(case, dtype, use_out):
    layout, slots = case
    check_translations(layout, slots, dtype, "cuda", use_out)


@SETTINGS
@given(
    batch=batches(cp_sizes=GPU_CP_SIZES, page_sizes=GPU_PAGE_SIZES, max_tokens=5000),
    width=st.sampled_from([1, 3, 128, 576]),
    dtype=st.sampled_from(ROW_DTYPES),
    seed=st.integers(0, 99),
)
def test_rerange_random_batches(batch, width, dtype, seed):
    check_rerange(batch, width, dtype, "cuda", seed, use_out=bool(seed % 2))


@pytest.mark.parametrize("P", [1, 64])
def test_fill_out_cache_loc_four_million_tokens(P):
    rng = np.random.default_rng(P)
    L0 = rng.integers(0, 5000, 64)
    E = rng.integers(1, 2 * (1 << 16), 64)
    plan = plan_batch(L0, E, CPConfig(8, P), head_owners=rng.integers(0, 8, 64))
    pages = rng.permutation(plan.page_owners.shape[0]) + 1
    last = np.where(L0 > 0, P * rng.integers(1, 1000, 64) + (L0 - 1) % P, -1)
    assert plan.num_tokens > 4_000_000
    check_fill_out_cache_loc(Batch(plan, last, pages), "cuda")


def test_translations_sixteen_million_slots():
    layout = SharedKVLayout(8, 64, 1 << 15)
    slots = np.random.default_rng(0).integers(-1, layout.num_slots, 1 << 24, dtype=np.int64)
    check_translations(layout, slots, torch.int64, "cuda", use_out=True)
    check_translations(layout, slots, torch.int32, "cuda", use_out=False)


@pytest.mark.parametrize(
    ("width", "dtype"), [(576, torch.float32), (576, torch.bfloat16), (128, torch.bfloat16)]
)
def test_rerange_150k_rows(width, dtype):
    # 150k rows: the host-side references stay well under the 3 GB a test process may use.
    plan = plan_batch(
        [0, 3000, 64],
        [100_000, 40_000, 10_000],
        CPConfig(8, 64, "balanced"),
        head_owners=[None, 5, None],
        phases=[3, 6, 1],
    )
    check_rerange(
        Batch(plan, np.full(3, -1), np.arange(plan.page_owners.shape[0])), width, dtype, "cuda", seed=7
    )


@pytest.mark.parametrize("policy", ["rotation", "balanced"])
def test_allocator_on_cuda_writes_out_cache_loc_with_the_kernel(monkeypatch, policy):
    gpu = OwnerLaneAllocator(CPConfig(8, 64, policy), 4096, device="cuda")
    monkeypatch.setenv("CPKV_KERNELS", "off")
    ref = OwnerLaneAllocator(CPConfig(8, 64, policy), 4096, device="cuda")
    assert gpu._kernels and not ref._kernels
    for L0, E, last in (
        ([0, 0], [100_000, 70], [-1, -1]),
        ([0], [1], [-1]),
        ([0, 0, 0], [5, 64, 129], [-1] * 3),
    ):
        a, b = gpu.alloc_extend(L0, E, last), ref.alloc_extend(L0, E, last)
        assert a.out_cache_loc.device.type == "cuda" and torch.equal(a.out_cache_loc, b.out_cache_loc)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_kernels_launch_on_the_tensors_device_not_the_current_one():
    plan = plan_batch([0, 10], [300, 90], CPConfig(4, 16), head_owners=[None, 1])
    assert torch.cuda.current_device() == 0
    check_fill_out_cache_loc(
        Batch(plan, np.array([-1, 9]), np.arange(plan.page_owners.shape[0]) + 1), "cuda:1"
    )
    check_rerange(
        Batch(plan, np.array([-1, 9]), np.arange(plan.page_owners.shape[0])), 576, torch.bfloat16, "cuda:1", 3
    )
    slots = torch.arange(-1, 1000, device="cuda:1")
    assert K.read_slots(SharedKVLayout(4, 16, 16), slots).device == slots.device
