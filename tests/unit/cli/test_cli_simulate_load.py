"""`cpkv simulate` prints the offered load against one group's capacity before its replay, and one line per
replay that livelocked after the table (a first screen that teaches)."""

import json

import pytest

from cpkv.cli import main
from cpkv.sim.config import SimConfig
from cpkv.sim.cost import IllustrativeCost
from cpkv.sim.load import load_lines, offered_load
from cpkv.sim.workload import build_workload

pytestmark = pytest.mark.unit


def test_load_lines_come_first_and_the_livelock_after_the_table(tmp_path, capsys):
    out = tmp_path / "o"
    assert (
        main(
            [
                "simulate",
                "--workload",
                "tiny-chunks",
                "--cost-model",
                "illustrative",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    spec = build_workload("tiny-chunks", seed=0)
    config = SimConfig.for_workload(spec)
    want = load_lines(
        offered_load(config, spec.requests, IllustrativeCost(config.cost, config.cp_size)),
        config,
        "illustrative constants",
    )
    assert lines[:3] == want
    assert lines[0] == "load: 64 requests arrive at once: 331,543 prompt tokens, 331,543 to prefill"
    assert lines[3].startswith("cpkv simulate: tiny chunks")  # the table's title right after
    finding = json.loads((out / "report.json").read_text())["policies"]["legacy"]["livelock"]
    free = finding["free_pages_per_lane"]
    assert finding["lane"] == 0 and free[0] == 0 and len(set(free[1:])) == 1  # lane 0 full, the rest all free
    assert lines[-2] == (
        f"legacy: livelock after {finding['stalled_steps']} steps without progress: lane 0 has 0 free "
        f"pages, the other lanes {free[1]:,} each; 64 admitted requests wait (report.json: "
        "policies.legacy.livelock)"
    )
    assert lines[-1].startswith("wrote ")
    assert sum("livelock after" in line for line in lines) == 1  # rotation and balanced finish


def test_a_run_that_fails_on_its_output_prints_no_load_first(tmp_path, capsys, monkeypatch):
    import cpkv.sim.report as report_mod

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_mod.os, "fsync", full)
    assert (
        main(
            [
                "simulate",
                "--max-requests",
                "3",
                "--cost-model",
                "illustrative",
                "--no-progress",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr()
    assert err.out == "" and err.err.count("\n") == 1 and "No space left on device" in err.err


@pytest.mark.parametrize(
    ("free", "lane", "where"),
    [
        ([0, 7, 9, 9], 0, "lane 0 has 0 free pages, the other lanes 7 to 9 each"),
        ([3, 5], -1, "free pages per lane 3 to 5"),  # no lane was short
        ([0], 0, "free pages per lane 0 to 0"),  # one lane: no others to name
    ],
)
def test_livelock_line_names_the_lane_when_there_is_one(free, lane, where):
    from cpkv.cli.simulate import livelock_line

    finding = {"free_pages_per_lane": free, "lane": lane, "stalled_steps": 1000, "blocked_count": 2}
    assert livelock_line("x", finding) == (
        f"x: livelock after 1,000 steps without progress: {where}; 2 admitted "
        "requests wait (report.json: policies.x.livelock)"
    )
