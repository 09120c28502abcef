"""Traffic as the planner will see it: ``--start`` / ``--duration`` cut a time window of
the workload, ``--rate-scale`` compresses its arrivals (the same requests); the report records both, and the
sweep's ``[workload]`` takes them."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.cli import main
from cpkv.errors import ConfigError
from cpkv.sim.window import traffic_window
from cpkv.sim.workload import build_workload

pytestmark = pytest.mark.unit
TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 60), st.one_of(st.none(), st.floats(0.5, 60)), st.one_of(st.none(), st.floats(0.25, 8)))
def test_window_keeps_exactly_the_requests_arriving_in_it(start, duration, scale):
    spec = build_workload("synthetic", num_requests=200, seed=1)
    lo, hi = 1000 * start, float("inf") if duration is None else 1000 * (start + duration)
    want = [r for r in spec.requests if lo <= r.arrival_ms < hi]  # oracle: the definition
    if not want:
        with pytest.raises(ConfigError, match="no request arrives in the window"):
            traffic_window(spec, start, duration, scale)
        return
    out = traffic_window(spec, start, duration, scale)
    assert [r.req_id for r in out.requests] == list(range(len(want)))
    assert [(r.input_length, r.output_length, r.hash_ids) for r in out.requests] == [
        (r.input_length, r.output_length, r.hash_ids) for r in want
    ]
    for a, b in zip(out.requests, want, strict=True):
        assert a.arrival_ms == pytest.approx((b.arrival_ms - lo) / (scale or 1.0))
    assert out.window == {
        "start_s": start,
        "duration_s": duration,
        "rate_scale": float(scale or 1.0),
        "requests_in_window": len(want),
    }


def test_window_errors_and_identity():
    spec = build_workload("synthetic", num_requests=10, seed=1)
    assert traffic_window(spec) is spec
    for args, message in (
        ((-1, None, None), "--start"),
        ((0, 0, None), "--duration"),
        ((0, None, 0), "--rate-scale"),
        ((0, None, float("inf")), "--rate-scale"),
    ):
        with pytest.raises(ConfigError, match=message):
            traffic_window(spec, *args)


def test_cli_records_the_window_and_caps_after_it(tmp_path):
    out = tmp_path / "o"
    assert (
        main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--start",
                "600",
                "--duration",
                "300",
                "--rate-scale",
                "2",
                "--max-requests",
                "40",
                "--cost-model",
                "illustrative",
                "--policy",
                "rotation",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    config = json.loads((out / "report.json").read_text())["config"]
    window = config["workload_window"]
    assert (window["start_s"], window["duration_s"], window["rate_scale"]) == (600.0, 300.0, 2.0)
    assert window["requests_in_window"] > 40 and config["workload_stats"]["num_requests"] == 40
    assert "window 600-900 s, rate x2" in config["workload_description"]
    assert (
        main(["simulate", "--trace", TRACE, "--start", "1e9", "--no-progress", "--out", str(tmp_path / "x")])
        == 2
    )


def test_the_sweep_workload_takes_the_window(tmp_path):
    from cpkv.sweep.grid import read_grid
    from cpkv.sweep.points import prepare_points

    grid = tmp_path / "g.toml"
    grid.write_text(
        f'[workload]\ntrace = "{TRACE}"\nstart = 600\nduration = 60\nrate_scale = 2.0\n\n'
        '[grid]\ncp_size = [4, 8]\ncost_model = "illustrative"\npolicy = "rotation"\n'
    )
    plan = prepare_points(read_grid(grid))
    (spec,) = plan.workloads.values()
    assert spec.window == {
        "start_s": 600.0,
        "duration_s": 60.0,
        "rate_scale": 2.0,
        "requests_in_window": len(spec.requests),
    }
    assert max(r.arrival_ms for r in spec.requests) < 30_000  # 60 s of traffic in 30
