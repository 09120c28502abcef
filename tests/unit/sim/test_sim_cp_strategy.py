"""The simulator under each CP strategy (SPEC C-INTERLEAVE): ``SimConfig.cp_strategy`` and
``--cp-strategy`` as a replay selector like ``--policy`` (repeatable, ``all``), keyed in the report; every KV
storage design computes with the group's strategy (owner-lane: owner == compute; the others store where
their own rule says); a sweep point keyed by its strategy."""

import json

import pytest

import oracle
from cpkv.cli import main
from cpkv.config import CP_STRATEGIES
from cpkv.errors import ConfigError
from cpkv.sim.config import KV_STORAGE_DESIGNS, SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.replay import replay, replays
from cpkv.sim.storage import build_storage
from cpkv.sim.storage.compute import CPCompute
from cpkv.sim.workload import build_workload
from cpkv.validate import expand_all

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-INTERLEAVE")]


def test_compute_plan_of_each_strategy():
    # SPEC section 18's example C=2, P=1, L0=0, E=5 (and C-ZIGZAG's): the rotation phase 0 either way
    assert CPCompute(2, 1).plan([0], [5]).token_owner.tolist() == [0, 0, 1, 1, 0]
    assert CPCompute(2, 1, "interleave").plan([0], [5]).token_owner.tolist() == [0, 1, 0, 1, 0]
    # C=4, P=64, L0=0, E=1000, request 1: phase 1, owners 1230 1230 ..., per rank [232, 256, 256, 256]
    plan = CPCompute(4, 64, "interleave").plan([0, 0], [0, 1000])
    assert plan.page_owners.tolist() == [1, 2, 3, 0] * 4
    assert plan.per_rank_tokens.tolist() == [232, 256, 256, 256]


def test_strategy_names_are_checked():
    assert expand_all(["interleave", "all"], CP_STRATEGIES, "cp_strategy") == ["interleave", "zigzag"]
    assert (
        SimConfig().cp_strategy == "zigzag"
        and SimConfig(cp_strategy="interleave").cp_strategy == "interleave"
    )
    with pytest.raises(
        ConfigError, match="cp_strategy 'diagonal' is unknown; use one of zigzag, interleave or all"
    ):
        SimConfig(cp_strategy="diagonal")
    with pytest.raises(ConfigError, match="'ring' is unknown"):
        expand_all(["zigzag", "ring"], CP_STRATEGIES, "cp_strategy")


def test_simulate_ignores_the_environment_variable(monkeypatch):
    # CPKV_CP_STRATEGY configures an engine's CPConfig; a replay is what its SimConfig says
    monkeypatch.setenv("CPKV_CP_STRATEGY", "interleave")
    run = PolicyRun(SimConfig(cp_size=2, page_size=1, pages_per_lane=8), "rotation", [])
    assert run.alloc.config.cp_strategy == "zigzag"
    assert run.alloc.plan_extend([0], [5], [-1]).page_owners.tolist() == [0, 0, 1, 1, 0]


def test_replay_labels():
    assert replays(["balanced"], ["owner-lane"], ["interleave"]) == [
        ("balanced", "interleave", "owner-lane", "balanced")
    ]
    assert [
        label for label, *_ in replays(["rotation"], ["owner-lane", "replicated"], ["zigzag", "interleave"])
    ] == [
        "zigzag/owner-lane/rotation",
        "zigzag/replicated",
        "interleave/owner-lane/rotation",
        "interleave/replicated",
    ]
    assert [
        label for label, *_ in replays(["rotation", "legacy"], ["owner-lane"], ["zigzag", "interleave"])
    ] == ["zigzag/rotation", "zigzag/legacy", "interleave/rotation", "interleave/legacy"]


@pytest.mark.parametrize("design", KV_STORAGE_DESIGNS)
def test_every_design_computes_with_the_strategy(design):
    # C=4, P=2, two fresh requests of 20 and 11 tokens: the plan's token owners are the oracle's interleave
    # split with the rotation phases (0 and 1) under every design; under owner-lane (rotation) each new page
    # lives on the lane that computes it (C-OWNER-EQ-COMPUTE), the other designs place pages their own way.
    cfg = SimConfig(cp_size=4, page_size=2, pages_per_lane=64, cp_strategy="interleave")
    storage = build_storage(design, cfg, "rotation", PolicyRun(cfg, "rotation", []).cost)
    plan = storage.alloc.plan_extend([0, 0], [20, 11], [-1, -1])
    want = oracle.plan_batch([0, 0], [20, 11], 4, 2, strategy="interleave")
    assert plan.token_owner.tolist() == want["token_owner"]
    assert plan.config.cp_strategy == "interleave" and storage.alloc.config.cp_strategy == "interleave"
    if design == "owner-lane":
        assert plan.page_owners.tolist() == want["page_owners"]
    elif (
        design == "interleaved"
    ):  # (b + j) % C with b the freest lane: lane 1 (lane 0 lost page 0), then 1 + 10
        assert plan.page_owners.tolist() == [(1 + j) % 4 for j in range(10)] + [(3 + j) % 4 for j in range(6)]


def test_both_strategies_replay_every_design_and_are_keyed_in_the_report(tmp_path):
    out = tmp_path / "o"
    rc = main(
        [
            "simulate",
            "--workload",
            "synthetic",
            "--max-requests",
            "16",
            "--cp-size",
            "4",
            "--pages-per-lane",
            "3000",
            "--policy",
            "balanced",
            "--kv-storage",
            "all",
            "--cp-strategy",
            "all",
            "--no-progress",
            "--cost-model",
            "illustrative",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "complete" and report["config"]["cp_strategies"] == ["zigzag", "interleave"]
    assert "cp_strategy" not in report["config"]
    labels = [
        f"{s}/{d}"
        for s in ("zigzag", "interleave")
        for d in ("owner-lane/balanced", "replicated", "interleaved", "interleaved-vblock")
    ]
    assert list(report["policies"]) == report["config"]["runs"] == labels
    for label, m in report["policies"].items():
        assert m["cp_strategy"] == label.split("/")[0]
        assert m["requests_finished"] == m["requests_total"] == 16 and not m["livelock_detected"]
    zig, inter = (
        report["policies"]["zigzag/owner-lane/balanced"],
        report["policies"]["interleave/owner-lane/balanced"],
    )
    assert (
        zig["prefill_tokens"] + zig["cache_hit_tokens"] == inter["prefill_tokens"] + inter["cache_hit_tokens"]
    )
    assert zig["compute_imbalance"] != inter["compute_imbalance"]  # the split changed what each rank computes


def test_one_strategy_keeps_the_labels_and_names_itself_in_the_config():
    spec = build_workload("synthetic", num_requests=6, seed=0, page_size=64)
    cfg = SimConfig(cp_size=2, pages_per_lane=4000)
    result = replay(cfg, spec, ["rotation"], cp_strategies=["interleave"], progress=False, table=False)
    assert [r.policy for r in result.results] == ["rotation"] and "runs" not in result.config
    assert (
        result.config["cp_strategies"] == ["interleave"]
        and result.results[0].metrics["cp_strategy"] == "interleave"
    )
    alone = replay(
        SimConfig(cp_size=2, pages_per_lane=4000, cp_strategy="interleave"),
        spec,
        ["rotation"],
        progress=False,
        table=False,
    )
    a, b = alone.results[0].metrics, result.results[0].metrics
    assert {k: v for k, v in a.items() if k != "sim_wall_s"} == {
        k: v for k, v in b.items() if k != "sim_wall_s"
    }


def test_sweep_point_key_and_rows_hold_the_strategy(tmp_path):
    from cpkv.sweep.grid import read_grid
    from cpkv.sweep.points import prepare_points

    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[workload]\nworkload = "synthetic"\nmax_requests = 4\n[grid]\npolicy = "balanced"\n'
        'cost_model = "illustrative"\ncp_strategy = "all"\n'
    )
    parsed = read_grid(grid)
    assert parsed.axes["cp_strategy"] == ("zigzag", "interleave")
    plan = prepare_points(parsed)
    assert [r["cp_strategy"] for r in plan.rows] == ["zigzag", "interleave"]
    keys = [r["key"] for r in plan.rows]
    assert len(set(keys)) == 2
    assert [plan.tasks[k].config.cp_strategy for k in keys] == ["zigzag", "interleave"]
    assert [r["policy"] for r in plan.rows] == ["balanced", "balanced"]
