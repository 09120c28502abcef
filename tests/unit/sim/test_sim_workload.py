"""Tests of cpkv.sim.workload: the synthetic generator, named workloads, stats (and the tiny-chunks shape)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.config import CPConfig
from cpkv.errors import ConfigError
from cpkv.planner import plan_request
from cpkv.sim.scenarios import TINY_CHUNKS_CHUNK_PAGES, tiny_chunks_workload
from cpkv.sim.trace import TRACE_BLOCK_TOKENS, Request, TraceStream, load_trace
from cpkv.sim.workload import WORKLOAD_NAMES, WorkloadSpec, build_workload, synthetic_workload, workload_stats

pytestmark = pytest.mark.unit

# ------------------------------------------------------------------------------------------ generators


def _check_well_formed(requests: list[Request]) -> None:
    """Invariants every workload satisfies (those load_trace enforces, plus block-id consistency)."""
    assert [r.req_id for r in requests] == list(range(len(requests)))
    assert np.all(np.diff([r.arrival_ms for r in requests]) >= 0)
    position_of: dict[int, int] = {}
    for r in requests:
        assert r.input_length >= 1 and r.output_length >= 0 and r.arrival_ms >= 0
        assert len(r.hash_ids) == math.ceil(r.input_length / TRACE_BLOCK_TOKENS)
        assert len(set(r.hash_ids)) == len(r.hash_ids)
        # shared blocks are leading runs, so a block id always sits at the same position in its prompt
        for k, block in enumerate(r.hash_ids):
            assert position_of.setdefault(block, k) == k


def test_synthetic_is_deterministic():
    assert synthetic_workload(200, seed=7) == synthetic_workload(200, seed=7)
    assert synthetic_workload(200, seed=7) != synthetic_workload(200, seed=8)


def test_synthetic_default_shape():
    requests = synthetic_workload()
    stats = workload_stats(requests)
    assert stats["num_requests"] == 1000
    _check_well_formed(requests)
    assert requests[0].arrival_ms == 0.0
    assert all(256 <= r.input_length <= 131_072 for r in requests)
    assert all(1 <= r.output_length <= 8192 for r in requests)
    assert 9_000 <= stats["prompt_tokens_mean"] <= 13_000
    assert 0.25 <= stats["repeated_block_share"] <= 0.45
    # Poisson at 4 requests/s: mean gap 250 ms; 999 gaps give a standard error of about 8 ms
    assert 210 <= stats["duration_ms"] / 999 <= 290
    # long tail: the largest prompt is many times the median
    lengths = np.array([r.input_length for r in requests])
    assert lengths.max() >= 5 * np.median(lengths)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(min_value=1, max_value=60),
    st.integers(min_value=0, max_value=2**32),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=1, max_value=4096),
)
def test_synthetic_invariants(num_requests, seed, shared_prefix_prob, min_prompt):
    requests = synthetic_workload(
        num_requests,
        seed,
        shared_prefix_prob=shared_prefix_prob,
        min_prompt_tokens=min_prompt,
        max_prompt_tokens=20_000,
    )
    assert len(requests) == num_requests
    _check_well_formed(requests)
    assert all(min_prompt <= r.input_length <= 20_000 for r in requests)


def test_synthetic_without_sharing_repeats_no_block():
    assert (
        workload_stats(synthetic_workload(300, seed=1, shared_prefix_prob=0.0))["repeated_block_share"] == 0.0
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_requests": 0}, "num_requests must be >= 1, got 0"),
        ({"seed": -1}, "seed must be >= 0, got -1"),
        ({"rate_per_s": 0.0}, "rate_per_s must be a positive finite number, got 0.0"),
        ({"rate_per_s": float("inf")}, "rate_per_s must be a positive finite number, got inf"),
        ({"mean_prompt_tokens": "10"}, "mean_prompt_tokens must be a positive number, got '10'"),
        ({"shared_prefix_prob": 1.5}, "shared_prefix_prob must be in [0, 1], got 1.5"),
        ({"min_prompt_tokens": 500, "max_prompt_tokens": 400}, "max_prompt_tokens must be >= 500, got 400"),
    ],
)
def test_synthetic_rejects_bad_settings(kwargs, message):
    with pytest.raises(ConfigError) as info:
        synthetic_workload(**kwargs)
    assert str(info.value) == message


def test_tiny_chunks_shape():
    requests = tiny_chunks_workload()
    assert len(requests) == 64
    _check_well_formed(requests)
    assert all(r.arrival_ms == 0.0 for r in requests)
    assert all(2048 <= r.input_length <= 8192 for r in requests)
    assert workload_stats(requests)["repeated_block_share"] == 0.0
    assert tiny_chunks_workload(seed=3) == tiny_chunks_workload(seed=3)
    assert tiny_chunks_workload(seed=3) != tiny_chunks_workload(seed=4)
    assert TINY_CHUNKS_CHUNK_PAGES == 1


@pytest.mark.clause("C-ROTATION-SPREADS")
def test_tiny_chunks_starve_lane_zero_under_legacy_only():
    # Prefill the first 8 requests one page (64 tokens) a chunk at cp_size 8; count new pages per lane.
    cp_size, page_size = 8, 64
    counts = {}
    for policy in ("legacy", "rotation"):
        config = CPConfig(cp_size=cp_size, page_size=page_size, owner_policy=policy)
        pages = np.zeros(cp_size, dtype=np.int64)
        for request in tiny_chunks_workload(8, seed=0):
            for prefix_len in range(0, request.input_length, page_size * TINY_CHUNKS_CHUNK_PAGES):
                extend_len = min(page_size, request.input_length - prefix_len)
                plan = plan_request(prefix_len, extend_len, config)
                np.add.at(pages, plan.page_owners, 1)
        counts[policy] = pages
    total = sum(math.ceil(r.input_length / page_size) for r in tiny_chunks_workload(8, seed=0))
    assert counts["legacy"].tolist() == [total] + [0] * 7
    assert counts["rotation"].sum() == total
    # rotation: chunk k of a request goes to lane k % 8, so each request adds at most 1 page of imbalance
    assert counts["rotation"].max() - counts["rotation"].min() <= 8


# ------------------------------------------------------------------------------------- named workloads


def test_build_workload(tmp_path):
    tiny = build_workload("tiny-chunks", num_requests=5, seed=2)
    assert tiny.chunk_pages == TINY_CHUNKS_CHUNK_PAGES
    assert tiny.requests == tuple(tiny_chunks_workload(5, seed=2))
    synthetic = build_workload("synthetic", num_requests=20, seed=2)
    assert synthetic.chunk_pages is None
    assert synthetic.requests == tuple(synthetic_workload(20, seed=2))
    path = tmp_path / "trace.jsonl"
    line = {"input_length": 1000, "output_length": 5, "hash_ids": [3, 4]}
    path.write_text("".join(json.dumps({"timestamp": t, **line}) + "\n" for t in range(4)))
    trace = build_workload("trace", num_requests=3, trace_path=path)
    assert isinstance(trace.requests, TraceStream)  # streamed: read from the file at each pass
    assert len(trace.requests) == 3
    assert tuple(trace.requests) == tuple(load_trace(path, max_requests=3))
    assert trace.chunk_pages is None
    assert set(WORKLOAD_NAMES) == {"synthetic", "tiny-chunks", "tiny-chunks-reload", "short-prompts", "trace"}
    assert (tiny.pool_percent, tiny.host_percent, synthetic.pool_percent, trace.pool_percent) == (
        125,
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        (
            "bogus",
            {},
            "workload 'bogus' is unknown; use one of synthetic, tiny-chunks, tiny-chunks-reload, short-prompts, trace",
        ),
        (
            "trace",
            {},
            "trace_path is required for workload 'trace' and only for it; got 'trace', trace_path=None",
        ),
        (
            "synthetic",
            {"trace_path": "x.jsonl"},
            "trace_path is required for workload 'trace' and only for it; got 'synthetic', trace_path='x.jsonl'",
        ),
    ],
)
def test_build_workload_rejects(name, kwargs, message):
    with pytest.raises(ConfigError) as info:
        build_workload(name, **kwargs)
    assert str(info.value) == message


def test_workload_spec_validates():
    with pytest.raises(ConfigError, match="chunk_pages must be >= 1, got 0"):
        WorkloadSpec(name="synthetic", requests=(), chunk_pages=0, description="")
    spec = WorkloadSpec(name="synthetic", requests=[], chunk_pages=None, description="d")
    assert spec.requests == ()


def test_workload_stats_hand_computed():
    requests = [
        Request(req_id=0, arrival_ms=0.0, input_length=1000, output_length=1, hash_ids=(1, 2)),  # new
        Request(req_id=1, arrival_ms=30.0, input_length=600, output_length=9, hash_ids=(1, 5)),  # 1 repeats
    ]
    stats = workload_stats(requests)
    assert stats == {
        "num_requests": 2,
        "prompt_tokens_total": 1600,
        "prompt_tokens_mean": 800.0,
        "prompt_tokens_max": 1000,
        "output_tokens_mean": 5.0,  # (1 + 9) / 2
        "duration_ms": 30.0,
        "repeated_block_share": 0.25,  # 1 of 4 block occurrences
    }
    assert workload_stats([])["num_requests"] == 0
