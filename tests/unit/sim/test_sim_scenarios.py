"""The lane-skew scenarios: short-prompts (C-PHASE's case for balanced) and tiny-chunks-reload (the whole
seed incident, C-RELOAD), their shapes, their pool sizing, and what each policy does with them."""

import pytest

from cpkv.errors import ConfigError
from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.metrics import lane_metrics
from cpkv.sim.scenarios import TINY_CHUNKS_CHUNK_PAGES, short_prompts_workload, tiny_chunks_reload_workload
from cpkv.sim.trace import TRACE_BLOCK_TOKENS
from cpkv.sim.workload import WorkloadSpec, build_workload

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------------------- short prompts
def test_short_prompts_shape():
    reqs = short_prompts_workload(50, seed=3, page_size=16, gap_ms=10.0)
    assert {r.input_length for r in reqs} == {16, 32}  # one or two whole pages, both drawn
    assert [r.arrival_ms for r in reqs] == [10.0 * i for i in range(50)]
    blocks = [b for r in reqs for b in r.hash_ids]
    assert len(blocks) == len(set(blocks))  # nothing shared
    assert reqs == short_prompts_workload(50, seed=3, page_size=16, gap_ms=10.0)
    assert reqs != short_prompts_workload(50, seed=4, page_size=16, gap_ms=10.0)
    with pytest.raises(ConfigError, match="gap_ms must be a finite number > 0, got 0"):
        short_prompts_workload(gap_ms=0)


@pytest.mark.clause("C-BALANCED")
def test_short_prompts_skew_lane0_under_rotation_and_legacy_balanced_spreads():
    # 64 prompts (seed 0) -> the pool is 125 % of their pages, 16 pages per lane. Rotation and legacy put
    # every first page on lane 0 (prefix 0, batch index 0 -> phase 0), so lane 0 fills and evicts while
    # lanes 2..7 hold nothing; balanced sends each request to the freest lanes and evicts nothing.
    spec = build_workload("short-prompts", num_requests=64, seed=0)
    cfg = SimConfig.for_workload(spec, cp_size=8, page_size=64)
    assert cfg.pages_per_lane == -(-spec.prompt_pages(64) * 125 // 800)
    for policy in ("rotation", "legacy"):
        m = PolicyRun(cfg, policy, spec.requests).run().metrics
        assert m["requests_finished"] == 64 and m["lane_imbalance_peak"] >= 2
        assert m["lane_pages_peak"][2:] == [0] * 6 and m["evicted_pages"] > 0
    run = PolicyRun(cfg, "balanced", spec.requests)
    m = run.run().metrics
    assert m["requests_finished"] == 64 and m["evicted_pages"] == 0
    # the lanes end balanced (lane_imbalance_peak counts every busy step, the first ones too)
    assert lane_metrics(run.rec.used()[-1:], cfg.pages_per_lane)["lane_imbalance_peak"] <= 1.05


# ------------------------------------------------------------------------------------ tiny-chunks reload
def test_tiny_chunks_reload_shape():
    reqs = tiny_chunks_reload_workload(4, seed=1, turns=3, warmup_ms=400.0, turn_gap_ms=1000.0, burst_ms=50.0)
    assert [r.req_id for r in reqs] == list(range(12))
    assert all(a.arrival_ms <= b.arrival_ms for a, b in zip(reqs, reqs[1:], strict=False))
    assert [r.arrival_ms for r in reqs[:4]] == [0.0, 100.0, 200.0, 300.0]  # first turns one at a time
    assert all(400.0 <= r.arrival_ms < 450.0 for r in reqs[4:8])  # the first follow-up burst
    assert all(1400.0 <= r.arrival_ms < 1450.0 for r in reqs[8:])
    for r in reqs:
        assert r.input_length == len(r.hash_ids) * TRACE_BLOCK_TOKENS  # whole blocks
    # every follow-up extends one earlier prompt by 1..4 fresh blocks (same block ids: a prefix hit)
    for r in reqs[4:]:
        parents = [
            p for p in reqs if p.arrival_ms < r.arrival_ms and r.hash_ids[: len(p.hash_ids)] == p.hash_ids
        ]
        assert parents and 1 <= len(r.hash_ids) - max(len(p.hash_ids) for p in parents) <= 4
    with pytest.raises(ConfigError, match="max_prompt_blocks must be >= 4, got 2"):
        tiny_chunks_reload_workload(min_prompt_blocks=4, max_prompt_blocks=2)


def test_tiny_chunks_reload_settings():
    spec = build_workload("tiny-chunks-reload", num_requests=10, seed=0)
    assert len(spec.requests) == 10  # the first 10 requests of ceil(10 / 3) = 4 conversations
    assert (spec.chunk_pages, spec.pool_percent, spec.host_percent) == (TINY_CHUNKS_CHUNK_PAGES, 17, 100)
    cfg = SimConfig.for_workload(spec, cp_size=4, page_size=64)
    pages = sum(-(-r.input_length // 64) for r in spec.requests)
    assert cfg.pages_per_lane == max(2, -(-pages * 17 // 400)) and cfg.host_pages_per_lane == pages
    assert cfg.chunk_size == 64
    assert SimConfig.for_workload(spec, host_pages_per_lane=0).host_pages_per_lane == 0  # a given value wins


@pytest.mark.clause("C-RELOAD")
def test_tiny_chunks_reload_fails_load_backs_under_legacy_only():
    # A small copy of the incident (24 conversations of 2-4 blocks, P=128, C=4): legacy records every
    # page on lane 0, the follow-up burst fills lane 0 with one-page chunks, and every waiting follow-up's
    # load-back fails each step (then C-RELOAD gives the rest to recompute). Rotation and balanced put the
    # prefixes back on their recorded lanes, spread over all four, and finish everything.
    reqs = tiny_chunks_reload_workload(
        24,
        seed=0,
        min_prompt_blocks=2,
        max_prompt_blocks=4,
        max_turn_blocks=2,
        warmup_ms=24_000.0,
        turn_gap_ms=10_000.0,
    )
    spec = WorkloadSpec(
        name="tiny-chunks-reload",
        requests=reqs,
        chunk_pages=1,
        description="small",
        pool_percent=17,
        host_percent=100,
    )
    cfg = SimConfig.for_workload(spec, cp_size=4, page_size=128)
    legacy = PolicyRun(cfg, "legacy", reqs).run().metrics
    assert legacy["load_back_owner_lane_capacity_failed"] >= 100 and legacy["lane_pages_peak"][1:] == [0] * 3
    for policy in ("rotation", "balanced"):
        m = PolicyRun(cfg, policy, reqs).run().metrics
        assert m["requests_finished"] == 72 and not m["livelock_detected"]
        assert m["load_back_pages"] > 0  # the follow-ups did come back from the host tier
        assert (
            m["load_back_owner_lane_capacity_failed"] <= legacy["load_back_owner_lane_capacity_failed"] // 100
        )
