"""The KV storage designs side by side (SPEC C-STORAGE): each design's capacity with the same HBM per rank, no
page leaked and every request ended under any of them, the replay labels, and ``--kv-storage`` through the CLI."""

import csv
import json

import pytest
from hypothesis import HealthCheck, given, settings

from cpkv.cli import main
from cpkv.sim.config import KV_STORAGE_DESIGNS, SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.replay import runs
from cpkv.sim.report import REPORT_FIELDS, STORAGE_FIELDS, format_value
from sim_workloads import workloads

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]

REASONS = {"pool", "lane", "logits_budget"}


# ------------------------------------------------------------------------------------------ the examples
@pytest.mark.parametrize(
    ("pages", "want"),
    [
        (
            8,
            {
                "owner-lane": 31 * 16,
                "replicated": 7 * 16,
                "interleaved": 31 * 16,
                "interleaved-vblock": 7 * 64,
            },
        ),
        # unequal ranks: a page every rank stores fits the smallest rank's memory
        (
            (9, 10, 10, 10),
            {
                "owner-lane": 38 * 16,
                "replicated": 8 * 16,
                "interleaved": 38 * 16,
                "interleaved-vblock": 8 * 64,
            },
        ),
    ],
)
def test_capacity_of_each_design_with_the_same_hbm_per_rank(pages, want, build_design):
    # C=4, P=16: owner lanes and interleaving hold C * Q pages (page 0 reserved), replicated Q, virtual blocks
    # Q blocks of P * C tokens
    cfg = SimConfig(cp_size=4, page_size=16, pages_per_lane=pages)
    assert {d: build_design(d, cfg).capacity_tokens() for d in KV_STORAGE_DESIGNS} == want


# --------------------------------------------------------------------------- no page leaked, no livelock
@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads(max_draft_tokens=3, max_requests=20))
def test_no_page_leaks_and_every_request_ends_under_every_design(case):
    cfg, reqs = case
    for design in KV_STORAGE_DESIGNS:
        run = PolicyRun(cfg, "balanced", reqs, kv_storage=design)
        m = run.run().metrics
        assert not m["livelock_detected"], (design, m["livelock"])
        assert m["requests_finished"] + m["requests_rejected"] == len(reqs), design
        assert set(m["rejection_reasons"]) <= REASONS
        assert m["leaked_pages"] == 0, design
        # every request gone: the pool holds exactly the cache's pages, lane by lane
        assert run.alloc.used_pages_per_lane().tolist() == run.cache.cached_pages_per_lane().tolist(), design
        assert 0 <= m["prefill_tokens_recomputed"] <= m["prefill_tokens"]


def test_runs_and_labels():
    assert runs(["rotation", "balanced"], ["owner-lane"]) == [
        ("rotation", "owner-lane", "rotation"),
        ("balanced", "owner-lane", "balanced"),
    ]
    assert [label for label, _, _ in runs(["balanced"], ["replicated", "owner-lane"])] == [
        "replicated",
        "owner-lane/balanced",
    ]
    assert format_value("kv_allgather_bytes_per_rank", 9_567_900_000_000) == "9,567.90 GB"


@pytest.mark.slow
def test_cli_kv_storage_all_keys_each_design(tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(
        [
            "simulate",
            "--workload",
            "synthetic",
            "--max-requests",
            "20",
            "--cp-size",
            "2",
            "--page-size",
            "64",
            "--pages-per-lane",
            "2000",
            "--kv-storage",
            "all",
            "--policy",
            "balanced",
            "--policy",
            "rotation",
            "--no-progress",
            "--cost-model",
            "illustrative",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    labels = ["owner-lane/balanced", "owner-lane/rotation", "replicated", "interleaved", "interleaved-vblock"]
    assert list(report["policies"]) == labels and report["status"] == "complete"
    assert report["config"]["runs"] == labels and report["config"]["kv_storage"] == list(KV_STORAGE_DESIGNS)
    assert [p["kv_storage"] for p in report["policies"].values()] == [
        d for d in KV_STORAGE_DESIGNS for _ in range(2 if d == "owner-lane" else 1)
    ]
    assert all(p["requests_finished"] == 20 for p in report["policies"].values())
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["policy"] for r in rows] == labels and list(rows[0])[1:] == [*REPORT_FIELDS, *STORAGE_FIELDS]
    assert (out / "storage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "kv_capacity_tokens" in table and "interleaved-vblock" in table
    # one design, owner-lane: the report of a run without designs (plain policy keys, no storage figure)
    plain = tmp_path / "p"
    assert (
        main(
            [
                "simulate",
                "--workload",
                "synthetic",
                "--max-requests",
                "5",
                "--cp-size",
                "2",
                "--policy",
                "rotation",
                "--no-progress",
                "--cost-model",
                "illustrative",
                "--out",
                str(plain),
            ]
        )
        == 0
    )
    report = json.loads((plain / "report.json").read_text())
    assert list(report["policies"]) == ["rotation"] and "runs" not in report["config"]
    assert sorted(p.name for p in plain.iterdir()) == [
        "config.json",
        "lanes.png",
        "report.json",
        "summary.csv",
    ]
    assert list(next(csv.DictReader((plain / "summary.csv").open())))[1:] == list(REPORT_FIELDS)
    capsys.readouterr()
    assert main(["simulate", "--kv-storage", "striped", "--no-progress", "--out", str(tmp_path / "x")]) == 2
    assert "striped" in capsys.readouterr().err
