"""Simulator MTP decode (``--spec-draft-tokens``, SPEC C-DRAFT): conservation, lanes, acceptance, CLI."""

import csv
import json

import numpy as np
import pytest

from cpkv.cli import main
from cpkv.errors import ConfigError
from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.report import SPEC_DECODE_FIELDS
from cpkv.sim.workload import build_workload

pytestmark = pytest.mark.unit

SMALL = {"cp_size": 4, "page_size": 16, "pages_per_lane": 4096, "chunk_size": 512, "max_batch_tokens": 1024}


def _run(policy, num_requests=30, seed=2, **kw):
    spec = build_workload("synthetic", num_requests=num_requests, seed=seed)
    run = PolicyRun(SimConfig(**SMALL, **kw), policy, spec.requests)
    return run, run.run().metrics, spec.requests


@pytest.mark.clause("C-DRAFT")
@pytest.mark.parametrize("policy", ["rotation", "legacy", "balanced"])
def test_every_request_finishes_and_no_page_leaks(policy):
    run, m, requests = _run(policy, spec_draft_tokens=3, spec_accept_rate=0.7)
    assert m["requests_finished"] == 30 and not m["livelock_detected"]
    # After the replay the only pages in use are the prefix cache's: no draft page leaked.
    assert m["leaked_pages"] == 0
    assert run.alloc.used_pages_per_lane().tolist() == run.cache.cached_pages_per_lane().tolist()
    # Every output token was emitted once: accepted drafts + bonus tokens, capped at output_length.
    assert run.drafts.kept_tokens == sum(r.output_length for r in requests)
    assert m["spec_accept_length"] == pytest.approx(run.drafts.kept_tokens / m["spec_verify_steps"])
    assert 0 < m["draft_pages_released"] < m["draft_pages_allocated"] == sum(m["draft_pages_per_lane"])
    lanes = np.asarray(m["draft_pages_per_lane"], dtype=float)
    assert m["draft_lane_imbalance"] == pytest.approx(lanes.max() / lanes.mean())


@pytest.mark.clause("C-DRAFT")
def test_legacy_piles_draft_pages_on_lane_0_rotation_spreads_them():
    _, legacy, _ = _run("legacy", spec_draft_tokens=3)
    assert legacy["draft_pages_per_lane"][1:] == [0, 0, 0] and legacy["draft_lane_imbalance"] == 4.0
    _, rotation, _ = _run("rotation", spec_draft_tokens=3)
    assert min(rotation["draft_pages_per_lane"]) > 0 and rotation["draft_lane_imbalance"] < 1.2


def test_acceptance_is_geometric_per_token():
    # K=3: two drafts, accepted with probability A each while the previous one was: E[a] = A + A^2.
    # With A=0.7 that is 1.19; over ~4000 request-steps the mean's standard error is ~0.013.
    run, m, _ = _run("rotation", num_requests=60, seed=3, spec_draft_tokens=3, spec_accept_rate=0.7)
    assert m["spec_verify_steps"] > 3000
    assert m["spec_accepted_drafts_per_step"] == pytest.approx(0.7 + 0.49, abs=0.07)
    # A = 1 accepts every draft: K tokens per step except where the output ends; A = 0: one token per step.
    _, all_in, _ = _run("rotation", num_requests=10, spec_draft_tokens=3, spec_accept_rate=1.0)
    assert all_in["spec_accepted_drafts_per_step"] == 2.0 and all_in["draft_pages_released"] == 0
    _, none, _ = _run("rotation", num_requests=10, spec_draft_tokens=3, spec_accept_rate=0.0)
    assert none["spec_accept_length"] == 1.0 and none["spec_accepted_drafts_per_step"] == 0.0


def test_one_slot_per_step_is_plain_decode():
    # K=1: alloc_draft(..., 1) is alloc_decode and the one slot (the root) is always kept.
    plain_run, plain, _ = _run("balanced", num_requests=20, colocated_decode=True)
    spec_run, spec, _ = _run("balanced", num_requests=20, spec_draft_tokens=1)
    assert spec["spec_accept_length"] == 1.0 and spec["draft_pages_released"] == 0
    for key in ("steps", "lane_pages_peak", "ttft_ms_p99", "evicted_pages", "sim_time_ms"):
        assert spec[key] == plain[key], key
    assert spec_run.alloc.state_digest() == plain_run.alloc.state_digest()


def test_same_seed_same_report_and_acceptance_per_request():
    a = _run("rotation", num_requests=15, spec_draft_tokens=4, seed=5)[1]
    b = _run("rotation", num_requests=15, spec_draft_tokens=4, seed=5)[1]
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b
    # Acceptance is seeded per request: the same requests get the same accepted counts under every policy.
    rot = _run("rotation", num_requests=15, spec_draft_tokens=4)[1]
    bal = _run("balanced", num_requests=15, spec_draft_tokens=4)[1]
    assert rot["spec_verify_steps"] == bal["spec_verify_steps"]
    assert rot["spec_accepted_drafts_per_step"] == bal["spec_accepted_drafts_per_step"]


def test_config_implies_colocated_decode_and_rejects_bad_values():
    assert SimConfig(spec_draft_tokens=2).colocated_decode is True
    assert SimConfig().colocated_decode is False and SimConfig().spec_draft_tokens == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match=r"spec_draft_tokens must be"):
            SimConfig(spec_draft_tokens=bad)
    for bad in (-0.1, 1.5, float("nan"), "0.7", True):
        with pytest.raises(ConfigError, match=r"spec_accept_rate must be a number in \[0, 1\]"):
            SimConfig(spec_accept_rate=bad)


def test_cli_flags_reach_the_report(tmp_path):
    rc = main(
        [
            "simulate",
            "--workload",
            "synthetic",
            "--max-requests",
            "12",
            "--cp-size",
            "4",
            "--page-size",
            "16",
            "--pages-per-lane",
            "1024",
            "--policy",
            "rotation",
            "--policy",
            "legacy",
            "--spec-draft-tokens",
            "3",
            "--spec-accept-rate",
            "0.5",
            "--no-progress",
            "--cost-model",
            "illustrative",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["config"]["spec_draft_tokens"] == 3 and report["config"]["spec_accept_rate"] == 0.5
    assert report["config"]["colocated_decode"] is True
    for policy in ("rotation", "legacy"):
        assert set(SPEC_DECODE_FIELDS) <= report["policies"][policy].keys()
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert rows[1]["draft_lane_imbalance"] == "4.0"  # legacy: every draft page on lane 0 of 4


@pytest.mark.clause("C-DRAFT")
def test_draft_slots_count_in_admission_no_livelock():
    # Fresh-eyes review: with K draft slots per step, a request needs K - 1 slots past its last token at
    # its peak. Admission priced only prompt + output, so K larger than the pool livelocked (0 finished,
    # 0 rejected) and K fitting the pool alone but not with the others deadlocked the decoding requests.
    small = {"cp_size": 4, "page_size": 16, "pages_per_lane": 64, "chunk_size": 512, "max_batch_tokens": 1024}
    spec = build_workload("synthetic", num_requests=8, seed=1)
    usable = 4 * 64 - 1  # page 0 is reserved
    too_big = 16 * usable + 1  # one draft step alone needs more pages than the pool has
    m = PolicyRun(SimConfig(**small, spec_draft_tokens=too_big), "balanced", spec.requests).run().metrics
    assert (m["requests_finished"], m["requests_rejected"], m["livelock_detected"]) == (0, 8, False)
    assert m["rejection_reasons"] == {"pool": 8}
    fits_alone = 16 * (usable // 2)  # about half the pool per draft step: requests must take turns
    run = PolicyRun(SimConfig(**small, spec_draft_tokens=fits_alone), "balanced", spec.requests)
    m = run.run().metrics
    need = [-(-(r.input_length + r.output_length + fits_alone - 1) // 16) for r in spec.requests]
    finished = sum(n <= usable for n in need)
    assert (m["requests_finished"], m["requests_rejected"], m["livelock_detected"]) == (
        finished,
        8 - finished,
        False,
    )
    assert m["leaked_pages"] == 0
