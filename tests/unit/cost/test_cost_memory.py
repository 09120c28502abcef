"""Pools that fit the GPU: under the measured model ``pages_per_lane`` defaults to the KV
pool SGLang would size beside the weights (aiconfigurator's KV-cache estimator); report.json / config.json
carry the memory of one GPU with sources; a larger explicit pool runs with one warning line."""

import json

import pytest

from cpkv.cli import main
from cpkv.cost import MeasuredSpec
from cpkv.sim.config import SimConfig
from cpkv.sim.workload import build_workload
from extras import COST

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-COST")]
TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"
PARTS = (
    "weights_bytes",
    "activations_bytes",
    "runtime_overhead_bytes",
    "comm_overhead_bytes",
    "kv_pool_bytes",
    "headroom_bytes",
)


def test_sglang_mem_fraction_static_is_sglangs_default():
    from cpkv.cost.memory import sglang_mem_fraction_static

    h200 = 141 * 2**30  # aiconfigurator's h200_sxm mem_capacity
    assert (
        sglang_mem_fraction_static(h200, 8192, 8)
        == round((144384 - (512 + 1.5 * 8192 + 1024)) / 144384, 3)
        == 0.904
    )
    assert sglang_mem_fraction_static(h200, 1024, 8) == round(
        (144384 - 10240) / 144384, 3
    )  # the 10 GiB floor
    assert sglang_mem_fraction_static(40 * 2**30, 1024, 8) == round((40960 - (512 + 3072 + 1024)) / 40960, 3)


def test_the_pool_and_the_rest_fill_the_gpu_exactly():
    COST.require()
    from cpkv.cost.memory import memory_plan

    m = memory_plan(MeasuredSpec(), 8, 8192, 16384, 256, 64)
    assert sum(m[k] for k in PARTS) == m["hbm_bytes"] and all(m[k] >= 0 for k in PARTS)
    assert m["weights_bytes"] + m["activations_bytes"] + m["kv_pool_bytes"] <= m["hbm_bytes"]
    assert m["pages_per_lane"] == m["kv_pool_tokens"] // 64 and m["mem_fraction_static"] == 0.904
    assert set(m["sources"]) >= {
        "hbm_bytes",
        "weights_bytes",
        "activations_bytes",
        "kv_pool_bytes",
        "headroom_bytes",
    }
    assert (
        memory_plan(MeasuredSpec(), 16, 8192, 16384, 256, 64)["pages_per_lane"] > m["pages_per_lane"]
    )  # EP 16
    short = memory_plan(MeasuredSpec(), 4, 8192, 16384, 256, 64)  # EP 4: the experts alone overflow an H200
    assert short["pages_per_lane"] == 0 == short["kv_pool_bytes"] and short["headroom_bytes"] < 0
    assert sum(short[k] for k in PARTS) == short["hbm_bytes"]
    spec = build_workload(
        "synthetic", num_requests=4, seed=0
    )  # no pool: the default, hypothetical (and said)
    assert (
        SimConfig.for_workload(spec, cp_size=4, measured=MeasuredSpec()).pages_per_lane
        == SimConfig.pages_per_lane
    )


def test_the_measured_default_pool_is_what_the_gpu_holds():
    COST.require()
    spec = build_workload("synthetic", num_requests=4, seed=0)
    cfg = SimConfig.for_workload(spec, measured=MeasuredSpec())
    assert cfg.pages_per_lane == cfg.memory()["pages_per_lane"] < SimConfig.pages_per_lane
    assert SimConfig.for_workload(spec).pages_per_lane == SimConfig.pages_per_lane  # illustrative: unchanged
    assert SimConfig.for_workload(spec, pages_per_lane=5000, measured=MeasuredSpec()).pages_per_lane == 5000


def test_cli_writes_the_memory_and_warns_on_a_larger_pool(tmp_path, capsys):
    COST.require()
    out = tmp_path / "o"
    base = ["simulate", "--trace", TRACE, "--max-requests", "10", "--policy", "rotation", "--no-progress"]
    assert main([*base, "--out", str(out)]) == 0
    assert "cpkv: warning" not in capsys.readouterr().err
    for name in ("report.json", "config.json"):
        doc = json.loads((out / name).read_text())
        config = doc.get("config", doc)
        mem = config["memory"]
        assert config["pages_per_lane"] == mem["pages_per_lane"] == mem["pages_per_lane_used"] and mem["fits"]
        assert mem["weights_bytes"] + mem["activations_bytes"] + mem["kv_pool_bytes"] <= mem["hbm_bytes"]
    assert main([*base, "--pages-per-lane", "16384", "--out", str(tmp_path / "big")]) == 0
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("cpkv: warning:")]
    assert (
        len(err) == 1 and "--pages-per-lane 16,384" in err[0] and f"{mem['pages_per_lane']:,} pages" in err[0]
    )
    assert json.loads((tmp_path / "big" / "config.json").read_text())["memory"]["fits"] is False


def test_cli_warns_when_the_model_does_not_fit(tmp_path, capsys):
    COST.require()
    assert (
        main(
            [
                "simulate",
                "--workload",
                "synthetic",
                "--max-requests",
                "4",
                "--cp-size",
                "4",
                "--policy",
                "rotation",
                "--no-progress",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("cpkv: warning:")]
    assert len(err) == 1 and "does not fit 4 x h200_sxm at EP 4" in err[0] and "hypothetical" in err[0]
