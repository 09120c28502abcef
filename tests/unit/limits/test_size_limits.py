"""Sizes are checked before anything is allocated (SPEC C-FAIL-FAST; ``cpkv.limits``).

A user-given length that would size arrays beyond ``MAX_ARRAY_BYTES`` raises a typed error naming the
bytes, and the failing call allocates next to nothing (tracemalloc, which numpy reports its buffers to,
peaks below 1 MiB): no 12.5 GB owner array before the error, as ``cpkv plan --extend-len 1e11`` built.
"""

import tracemalloc
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cpkv.limits
from allocator_state import snapshot
from cpkv import (
    ConfigError,
    CPConfig,
    OwnerLaneAllocator,
    PlanError,
    SharedKVLayout,
    plan_batch,
    plan_request,
)
from cpkv.cli import main
from cpkv.errors import LayoutError
from cpkv.validate import plan_bytes

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-FAIL-FAST")]

BIG = 10**11  # tokens: 2.4 TB of plan arrays


def peak_bytes(fn, error):
    """Run ``fn`` expecting ``error``; return (the error, peak traced bytes during the call)."""
    tracemalloc.start()
    try:
        with pytest.raises(error) as info:
            fn()
        return info.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "call",
    [
        lambda: plan_batch([0], [BIG], CPConfig(4, 64)),
        lambda: plan_request(0, BIG, CPConfig(4, 1)),
        lambda: plan_batch([0] * 3, [BIG // 3] * 3, CPConfig(8, 64)),
        lambda: plan_batch([0] * 7000, [1] * 7000, CPConfig(4096, 64)),  # cp_size sizes the segment tables
    ],
)
def test_huge_plans_fail_before_allocating(call):
    err, peak = peak_bytes(call, PlanError)
    assert "bytes" in str(err) and "cpkv.limits.MAX_ARRAY_BYTES" in str(err)
    assert peak < 2**20


def test_message_names_tokens_pages_and_bytes():
    # 10**11 tokens at P=64: 1,562,500,000 pages; 8 * (3e11 + 3.125e9) + 80 * (2 * 4 + 1) bytes.
    with pytest.raises(
        PlanError,
        match=r"100,000,000,000 tokens and 1,562,500,000 new pages at cp_size=4 would "
        r"need 2,425,000,000,720 bytes",
    ):
        plan_batch([0], [BIG], CPConfig(4, 64))


def test_alloc_extend_and_decode_fail_before_allocating_and_change_nothing(monkeypatch):
    alloc = OwnerLaneAllocator(CPConfig(4, 64), 8)
    before = snapshot(alloc)
    err, peak = peak_bytes(lambda: alloc.alloc_extend([0], [BIG], [-1]), PlanError)
    assert peak < 2**20 and snapshot(alloc) == before
    # A batch the single-page path would take (E < 2P) but above a lowered limit: the general path's check.
    monkeypatch.setattr(cpkv.limits, "MAX_ARRAY_BYTES", 1000)
    with pytest.raises(PlanError, match="would need"):
        alloc.alloc_extend([0] * 20, [64] * 20, [-1] * 20)
    assert snapshot(alloc) == before
    monkeypatch.undo()
    last = alloc.alloc_extend([0] * 20, [1] * 20, [-1] * 20).out_cache_loc.numpy()  # 20 one-token requests
    before = snapshot(alloc)
    monkeypatch.setattr(cpkv.limits, "MAX_ARRAY_BYTES", 1000)
    with pytest.raises(PlanError, match="would need"):  # 8 * (3 * 20 + 2 * 0) + 80 * 20 * 9 bytes
        alloc.alloc_decode([1] * 20, last)
    assert snapshot(alloc) == before


@pytest.mark.parametrize("C", [1, 4])
def test_limit_boundary_is_exact(C, monkeypatch):
    # plan_bytes is what the check compares: a plan of exactly the limit passes, one byte less fails.
    L0, E = np.array([0, 100]), np.array([1000, 37])
    tokens, pages, nbytes = plan_bytes(L0, E, CPConfig(C, 64))
    assert (tokens, pages) == (1037, 16 + 1)  # 1000 tokens: 16 pages; 100 -> 137: pages 2 -> 3, one new
    assert nbytes == 8 * (3 * 1037 + 2 * 17) + 80 * 2 * (2 * C + 1)
    monkeypatch.setattr(cpkv.limits, "MAX_ARRAY_BYTES", nbytes)
    plan_batch(L0, E, CPConfig(C, 64), head_owners=[None, 1 % C])
    monkeypatch.setattr(cpkv.limits, "MAX_ARRAY_BYTES", nbytes - 1)
    with pytest.raises(PlanError, match=f"would need {nbytes:,} bytes"):
        plan_batch(L0, E, CPConfig(C, 64), head_owners=[None, 1 % C])


@settings(max_examples=30, deadline=None)
@given(
    C=st.integers(1, 8),
    P=st.sampled_from([1, 16, 64]),
    lens=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 3000)), min_size=1, max_size=5),
)
def test_plan_bytes_bound_what_a_plan_and_its_allocation_keep(C, P, lens):
    L0 = np.array([0 for _ in lens])
    E = np.array([e for _, e in lens])
    alloc = OwnerLaneAllocator(CPConfig(C, P, "rotation"), sum(-(-e // P) for e in E.tolist()) + 2)
    res = alloc.alloc_extend(L0, E, np.full(len(lens), -1))
    plan = res.plan
    kept = sum(getattr(plan, f).nbytes for f in ("token_owner", "gather_index", "page_owners"))
    kept += res.out_cache_loc.numel() * 8 + res.new_pages.nbytes
    tokens, pages, nbytes = plan_bytes(L0, E, CPConfig(C, P))
    assert (tokens, pages) == (plan.num_tokens, plan.page_owners.shape[0])
    assert kept <= nbytes <= kept + 80 * len(lens) * (2 * C + 1)


def test_huge_allocator_fails_before_allocating():
    err, peak = peak_bytes(lambda: OwnerLaneAllocator(CPConfig(8, 64), 10**9), ConfigError)
    assert "an allocator of 8,000,000,000 pages" in str(err) and "256,000,000,000 bytes" in str(err)
    assert peak < 2**20


def test_cli_plan_huge_extend_exits_2_at_once(capsys):
    tracemalloc.start()
    try:
        assert main(["plan", "--prefix-len", "0", "--extend-len", str(BIG)]) == 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cpkv: error: a plan of 1 request(s)") and "bytes" in err
    assert peak < 4 * 2**20


def test_trace_line_too_large_for_the_simulator(tmp_path):
    from cpkv.sim.trace import TraceError, load_trace

    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": 10, "output_length": 1000000000000, "hash_ids": [2]}\n'
    )
    with pytest.raises(
        TraceError,
        match=r"t.jsonl:2: input_length 10 \+ output_length 1000000000000 would need "
        r"8,000,000,000,160 bytes",
    ):
        load_trace(f)


def test_run_dist_workload_and_kv_buffer_too_large():
    from cpkv.executor.kv_buffer import create_kv_buffer
    from cpkv.executor.workload import make_workload

    err, peak = peak_bytes(lambda: make_workload([0], [10**10]), PlanError)
    assert "a run-dist workload of 10,000,000,000 tokens" in str(err) and peak < 2**20
    group = types.SimpleNamespace(world_size=2, rank=0, device=torch.device("cpu"))
    layout = SharedKVLayout(2, 64, 10**7)  # 1.28e9 slots x 2 layers x 64 floats x 4 B
    with pytest.raises(
        ConfigError,
        match=r"a KV buffer of 2 layers x 1,280,000,000 slots x 64 floats would need "
        r"655,360,000,000 bytes",
    ):
        create_kv_buffer(group, layout, 2, 64, kind="mirrored", tag="t")


@pytest.mark.clause("C-FAIL-FAST")
def test_a_pool_with_more_slots_than_2_pow_53_is_refused_before_anything_is_built():
    # slot = page * P + offset must stay exact (int64, float64): 4 lanes x 8 pages x 2**62 tokens would wrap
    # out_cache_loc onto page 0 (the padding page) or negative (padding) slots.
    with pytest.raises(
        ConfigError,
        match=r"a pool of 32 pages of page_size=4611686018427387904 has more than 9007199254740992",
    ):
        OwnerLaneAllocator(CPConfig(4, 2**62, "rotation"), 8)
    with pytest.raises(
        LayoutError, match=r"cp_size=4 x pages_per_lane=2 x page_size=4611686018427387904 slots exceeds"
    ):
        SharedKVLayout(4, 2**62, 2)
    assert (
        OwnerLaneAllocator(CPConfig(2, 2**50, "rotation"), 4).num_pages == 8
    )  # 2**53 slots: the largest pool
