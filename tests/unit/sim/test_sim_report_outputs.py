"""`cpkv simulate` never loses results: output directory probed first, every file atomic, a late
write failure keeps the table and exits 2 naming the path, Ctrl-C keeps the finished policies."""

import csv
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cpkv.sim.replay as replay_mod
import cpkv.sim.report as report_mod
from cpkv.cli import main
from cpkv.sim.engine import PolicyRun
from cpkv.sim.report import ReportWriteError, prepare_out_dir, write_atomic

pytestmark = pytest.mark.unit

SMALL = [
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
    "--no-progress",
    "--cost-model",
    "illustrative",
]


def _hooked(before=None, after=None):
    """A ``PolicyRun`` that calls ``before(policy)`` and ``after(policy)`` around the real replay."""

    class Hooked(PolicyRun):
        def run(self, on_progress=None):
            if before:
                before(self.policy)
            result = super().run(on_progress)
            if after:
                after(self.policy)
            return result

    return Hooked


@pytest.fixture
def hook_runs(monkeypatch):
    return lambda before=None, after=None: monkeypatch.setattr(
        replay_mod, "PolicyRun", _hooked(before, after)
    )


def _table_rows(stdout: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in stdout.splitlines() if line.strip()[:1].islower()}


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_unwritable_out_dir_fails_before_the_replay(capsys):
    # As root /proc passes os.access(W_OK), yet mkdir fails: the probe must catch it before any work.
    t0 = time.perf_counter()
    assert main(["simulate", *SMALL, "--out", "/proc/cpkvout"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and out.err.startswith("cpkv: error:")
    assert "/proc/cpkvout" in out.err
    assert time.perf_counter() - t0 < 60  # well before a replay would finish on a loaded machine


def test_probe_failure_is_a_report_write_error_and_leaves_nothing(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report_mod.os, "fsync", full)
    with pytest.raises(ReportWriteError, match=f"cannot write {tmp_path / 'o'}: No space left on device"):
        prepare_out_dir(tmp_path / "o")
    assert list((tmp_path / "o").iterdir()) == []  # the probe file was removed


def test_probe_creates_the_directory_and_leaves_it_empty(tmp_path):
    prepare_out_dir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir() and list((tmp_path / "a" / "b").iterdir()) == []


def test_late_write_failure_prints_table_then_one_error_line_exit_2(tmp_path, hook_runs, capsys):
    out_dir = tmp_path / "o"
    # After the replay (the probe passed long before), report.json's name is taken by a directory.
    hook_runs(after=lambda policy: (out_dir / "report.json").mkdir())
    assert main(["simulate", *SMALL, "--policy", "rotation", "--out", str(out_dir)]) == 2
    out = capsys.readouterr()
    rows = _table_rows(out.out)
    assert rows["requests_finished"] == ["12"] and "sim_wall_s" in rows  # the results were printed
    assert out.err == (
        f"cpkv: error: cannot write {out_dir / 'report.json'}: Is a directory (wrote config.json, "
        "summary.csv, lanes.png; the table above has the results)\n"
    )
    assert [r["policy"] for r in csv.DictReader((out_dir / "summary.csv").open())] == ["rotation"]
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "config.json",
        "lanes.png",
        "report.json",
        "summary.csv",
    ]


def test_disk_full_at_the_end_names_the_file(tmp_path, monkeypatch, capsys):
    real = report_mod.write_atomic

    def full_for_png(path, data):
        if path.name == "lanes.png":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(report_mod, "write_atomic", full_for_png)
    out_dir = tmp_path / "o"
    assert main(["simulate", *SMALL, "--policy", "rotation", "--out", str(out_dir)]) == 2
    out = capsys.readouterr()
    assert "requests_finished" in out.out
    assert out.err.count("\n") == 1
    assert out.err.startswith(f"cpkv: error: cannot write {out_dir / 'lanes.png'}: No space left on device")
    assert json.loads((out_dir / "report.json").read_text())["status"] == "complete"
    assert not [p for p in out_dir.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_failing_figure_costs_no_other_file(tmp_path, monkeypatch):
    def broken(*args):  # as after a Ctrl-C inside matplotlib's first import
        raise AttributeError("module 'matplotlib' has no attribute 'get_data_path'")

    monkeypatch.setattr(report_mod, "_lanes_png", broken)
    with pytest.raises(
        ReportWriteError, match=r"lanes.png: cannot produce it: AttributeError: .* \(wrote report.json"
    ):
        report_mod.write_outputs(tmp_path, {"policies": []}, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "report.json", "summary.csv"]


def test_each_file_is_replaced_atomically(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    target.write_bytes(b"old")

    def fail(*args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(report_mod.os, "replace", fail)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]
    monkeypatch.undo()
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


@pytest.mark.slow
def test_report_is_written_after_each_policy(tmp_path, hook_runs):
    out_dir = tmp_path / "o"
    seen = {}

    def before(policy):
        path = out_dir / "report.json"
        seen[policy] = json.loads(path.read_text()) if path.exists() else None

    hook_runs(before=before)
    assert main(["simulate", *SMALL, "--out", str(out_dir)]) == 0
    assert seen["rotation"] is None
    for policy, done, pending in (
        ("legacy", ["rotation"], ["legacy", "balanced"]),
        ("balanced", ["rotation", "legacy"], ["balanced"]),
    ):
        assert (seen[policy]["status"], list(seen[policy]["policies"]), seen[policy]["policies_pending"]) == (
            "incomplete",
            done,
            pending,
        )
    final = json.loads((out_dir / "report.json").read_text())
    assert (final["status"], list(final["policies"]), final["policies_pending"]) == (
        "complete",
        ["rotation", "legacy", "balanced"],
        [],
    )


def test_interrupt_after_the_first_policy_keeps_it(tmp_path, hook_runs, capsys):
    out_dir = tmp_path / "o"

    def ctrl_c(policy):
        if policy == "legacy":
            raise KeyboardInterrupt

    hook_runs(before=ctrl_c)
    assert main(["simulate", *SMALL, "--policy", "all", "--out", str(out_dir)]) == 130
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        f"cpkv: aborted: interrupted after rotation (legacy, balanced not run); wrote the finished policies to "
        f"{out_dir} (report.json status: interrupted)",
    ]
    assert _table_rows(out.out)["requests_finished"] == ["12"]  # the finished policy's table
    report = json.loads((out_dir / "report.json").read_text())
    assert (report["status"], list(report["policies"]), report["policies_pending"]) == (
        "interrupted",
        ["rotation"],
        ["legacy", "balanced"],
    )
    assert report["policies"]["rotation"]["requests_finished"] == 12
    assert [r["policy"] for r in csv.DictReader((out_dir / "summary.csv").open())] == ["rotation"]
    assert (out_dir / "lanes.png").read_bytes()[:4] == b"\x89PNG"


def test_interrupt_before_any_policy_finished_writes_nothing(tmp_path, hook_runs, capsys):
    def ctrl_c(policy):
        raise KeyboardInterrupt

    hook_runs(before=ctrl_c)
    assert main(["simulate", *SMALL, "--out", str(tmp_path / "o")]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "cpkv: aborted: interrupted before any policy finished; nothing was written"
    ]
    assert list((tmp_path / "o").iterdir()) == []


_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the test runner ignores SIGINT
from cpkv.cli import main
from cpkv.sim.engine import PolicyRun
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_real_sigint_after_the_first_policy(tmp_path):
    # tiny-chunks: rotation finishes in well under a second, legacy then runs for seconds into its livelock.
    out_dir = tmp_path / "o"
    argv = [
        "simulate",
        "--workload",
        "tiny-chunks",
        "--policy",
        "rotation",
        "--policy",
        "legacy",
        "--no-progress",
        "--cost-model",
        "illustrative",
        "--out",
        str(out_dir),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "140"},
    )
    deadline = time.monotonic() + 240  # lanes.png is the last file of the report written after rotation
    while not (out_dir / "lanes.png").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert err.splitlines()[-1:] == [
        f"cpkv: aborted: interrupted after rotation (legacy not run); wrote the finished policies to {out_dir} "
        "(report.json status: interrupted)",
    ]
    report = json.loads((out_dir / "report.json").read_text())
    assert (report["status"], list(report["policies"])) == ("interrupted", ["rotation"])
    assert report["policies"]["rotation"]["requests_finished"] == 64
