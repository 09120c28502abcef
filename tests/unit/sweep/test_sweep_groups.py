"""A point of N groups: the workload split over the groups, each replayed through ``cpkv
simulate``'s replay, the reports combined by one rule per metric; one group is ``cpkv simulate`` exactly."""

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.cli import main
from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.metrics import percentile_ms
from cpkv.sim.report import REPORT_FIELDS, SPEC_DECODE_FIELDS
from cpkv.sim.trace import Request
from cpkv.sim.workload import build_workload
from cpkv.sweep.groups import PREFIX_ROUTE_BLOCKS, RULES, combine, prefix_group, split
from cpkv.sweep.point import PointTask, run_task, workload_digest

pytestmark = pytest.mark.unit


def _requests(n: int, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(i, float(i), 600, 1, tuple(int(b) for b in rng.integers(0, 5, 2))) for i in range(n)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), groups=st.integers(1, 7), seed=st.integers(0, 9))
def test_split_routes_every_request_once_in_arrival_order(n, groups, seed):
    requests = _requests(n, seed)
    rr = split(requests, groups, "round-robin")
    assert [[r.req_id for r in g] for g in rr] == [
        [i for i in range(n) if i % groups == g] for g in range(groups)
    ]
    by_prefix = split(requests, groups, "prefix")
    assert len(by_prefix) == groups
    assert sorted(r.req_id for g in by_prefix for r in g) == list(range(n))
    for g, part in enumerate(by_prefix):
        assert [r.req_id for r in part] == sorted(r.req_id for r in part)
        for r in part:  # the oracle: the documented hash, written out here
            text = ",".join(map(str, r.hash_ids[:PREFIX_ROUTE_BLOCKS]))
            h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            assert h % groups == g


def test_prefix_routing_keeps_shared_first_blocks_together():
    a, b = (0, 17, 1, 2), (0, 17, 9)
    assert prefix_group(a, 5) == prefix_group(b, 5)
    assert {prefix_group((0, k), 4) for k in range(64)} == {0, 1, 2, 3}  # the second block spreads them
    with pytest.raises(ValueError, match="routing must be one of"):
        split([], 2, "random")
    with pytest.raises(ValueError, match="groups must be >= 1"):
        split([], 0, "round-robin")


def test_every_report_metric_has_a_rule_to_combine_groups():
    # A metric added to the report must say how groups combine it (else a groups > 1 point fails).
    assert set(REPORT_FIELDS) | set(SPEC_DECODE_FIELDS) <= set(RULES)
    cfg = SimConfig(cp_size=2, page_size=16, pages_per_lane=400, host_pages_per_lane=64, spec_draft_tokens=2)
    spec = build_workload("tiny-chunks-reload", num_requests=12, seed=1)
    runs = [PolicyRun(cfg, "balanced", part) for part in split(spec.requests, 2, "round-robin")]
    results = [r.run() for r in runs]
    assert set(results[0].metrics) <= set(RULES)
    combined = combine([r.metrics for r in results], [r.ttft_ms for r in results])
    assert set(combined) == set(results[0].metrics)
    with pytest.raises(ValueError, match="no rule combines metric 'new_metric'"):
        combine([{"new_metric": 1}, {"new_metric": 2}], [np.zeros(0), np.zeros(0)])


def test_groups_combine_by_their_rules_against_each_groups_replay():
    cfg = SimConfig(cp_size=2, page_size=16, pages_per_lane=300, chunk_size=256, max_batch_tokens=512)
    spec = build_workload("synthetic", num_requests=30, seed=3)
    task = PointTask("k", "w", cfg, "rotation", 3, "round-robin")
    out = run_task(task, {"w": spec})
    assert out["status"] == "ok", out["error"]
    m = out["metrics"]
    runs = [PolicyRun(cfg, "rotation", spec.requests[g::3]) for g in range(3)]  # the groups, replayed here
    parts = [r.run().metrics for r in runs]
    ttft = np.concatenate([np.asarray(r.counters.ttft_ms) for r in runs])
    assert m["requests_total"] == 30 == sum(p["requests_total"] for p in parts)
    for key in ("requests_finished", "prefill_tokens", "cache_hit_tokens", "evicted_pages", "steps"):
        assert m[key] == sum(p[key] for p in parts), key
    for key in ("lane_imbalance_peak", "compute_imbalance", "mqa_logits_peak_elements", "sim_time_ms"):
        assert m[key] == max(p[key] for p in parts), key
    assert m["lane_pages_peak"] == np.max([p["lane_pages_peak"] for p in parts], axis=0).tolist()
    # every request is in the pooled percentiles, the unfinished ones (rejected here) as later than all
    unfinished = 30 - len(ttft)
    assert m["requests_unfinished"] == unfinished == sum(p["requests_unfinished"] for p in parts)
    assert m["ttft_ms_p99"] == percentile_ms(ttft.tolist(), 99, unfinished)
    assert m["ttft_ms_p50"] == percentile_ms(ttft.tolist(), 50, unfinished)
    assert m["livelock_detected"] is False
    assert m["cache_hit_rate"] == m["cache_hit_tokens"] / (m["cache_hit_tokens"] + m["prefill_tokens"])
    assert [g["requests_total"] for g in out["per_group"]] == [10, 10, 10]


def test_an_empty_group_replays_nothing():
    cfg = SimConfig(cp_size=2, page_size=16, pages_per_lane=300)
    spec = build_workload("synthetic", num_requests=2, seed=0)
    out = run_task(PointTask("k", "w", cfg, "balanced", 3, "round-robin"), {"w": spec})
    assert out["status"] == "ok", out["error"]
    assert [g["requests_total"] for g in out["per_group"]] == [1, 1, 0]
    assert out["metrics"]["requests_finished"] == 2


def test_one_group_is_cpkv_simulate_exactly(tmp_path):
    # The same code: a one-group point's metrics are cpkv simulate's report for that policy, field for field.
    argv = [
        "--workload",
        "synthetic",
        "--max-requests",
        "12",
        "--cp-size",
        "4",
        "--page-size",
        "16",
        "--pages-per-lane",
        "700",
        "--cost-model",
        "illustrative",
        "--seed",
        "5",
    ]
    assert (
        main(["simulate", *argv, "--policy", "legacy", "--no-progress", "--out", str(tmp_path / "sim")]) == 0
    )
    report = json.loads((tmp_path / "sim" / "report.json").read_text())["policies"]["legacy"]
    grid = tmp_path / "g.toml"
    grid.write_text(
        "[workload]\nworkload = 'synthetic'\nmax_requests = 12\n[grid]\ncp_size = 4\npage_size = 16\n"
        "pages_per_lane = 700\ncost_model = 'illustrative'\nseed = 5\npolicy = ['legacy', 'balanced']\n"
    )
    assert main(["sweep", str(grid), "--out", str(tmp_path / "sw"), "--no-progress", "--workers", "1"]) == 0
    point = json.loads((tmp_path / "sw" / "results.json").read_text())["points"][0]
    assert point["settings"]["policy"] == "legacy"
    report.pop("sim_wall_s")
    assert point["metrics"] == report
    spec = build_workload("synthetic", num_requests=12, seed=5)
    stored = json.loads((tmp_path / "sw" / "points" / f"{point['key']}.json").read_text())
    assert stored["workload_digest"] == workload_digest(spec.requests)
