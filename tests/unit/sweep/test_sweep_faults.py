"""``cpkv sweep`` under faults and odd grids: an ``[[exclude]]`` key the
grid does not name compares the value the replay uses; a stored point that does not validate is replayed;
the grid's size is checked before anything is built; the designs table has one row per non-owner design;
a Ray address that does not answer is one line; a killed pool worker costs its own point only; SIGTERM
stops the sweep as Ctrl-C does (exit 143); workers exit when the driver dies."""

import csv
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cpkv.cli import main
from cpkv.sweep.grid import read_grid
from cpkv.sweep.points import prepare_points
from extras import COST, RAY

pytestmark = pytest.mark.unit

SMALL = """[workload]
workload = "synthetic"
max_requests = 8

[grid]
cp_size = 2
page_size = 16
pages_per_lane = 600
cost_model = "illustrative"
"""

LONG = """[workload]
workload = "synthetic"
max_requests = 60

[grid]
cp_size = [2, 4]
page_size = 16
pages_per_lane = [300, 1200]
policy = ["rotation", "balanced"]
groups = [1, 2, 3]
cost_model = "illustrative"
"""  # 24 points of about a second each
DRIVER = ["-c", "import sys; from cpkv.cli import main; sys.exit(main(sys.argv[1:]))"]


def _grid(tmp_path: Path, text: str, name: str = "grid.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _rows(out: Path, name: str = "results.csv") -> list[dict]:
    with open(out / name, newline="") as f:
        return list(csv.DictReader(f))


def _sweep(grid: Path, out: Path, *extra: str) -> int:
    return main(["sweep", str(grid), "--out", str(out), "--no-progress", *extra])


# ------------------------------------------------------------------------------------------------ grid
@pytest.mark.parametrize(
    ("key", "used", "other"),
    [
        ("pages_per_lane", "16384", "1"),
        ("chunk_size", "8192", "1"),
        ("host_pages_per_lane", "0", "1"),
        ("kv_storage", '"owner-lane"', '"interleaved"'),
        ("gpu", '"h200_sxm"', '"b200_sxm"'),
    ],
)
def test_an_exclude_key_the_grid_does_not_name_compares_the_value_the_replay_uses(tmp_path, key, used, other):
    COST.require()
    text = f"""[workload]
workload = "synthetic"
max_requests = 4

[grid]
cp_size = [2, 4]
policy = "rotation"

[[exclude]]
cp_size = 2
{key} = {used}
"""
    rows = prepare_points(read_grid(_grid(tmp_path, text))).rows
    assert [(r["point"], r["cp_size"]) for r in rows] == [(1, 4)]
    assert str(rows[0][key]) == used.strip('"')  # the value results.csv shows for the point kept
    kept = prepare_points(
        read_grid(_grid(tmp_path, text.replace(f"{key} = {used}", f"{key} = {other}")))
    ).rows
    assert [r["cp_size"] for r in kept] == [2, 4]  # another value excludes nothing


def test_an_unnamed_pages_per_lane_compares_the_pool_auto_derives(tmp_path):
    """docs/sweep.md: with ``pages_per_lane`` not named, a rule compares the pool ``"auto"`` derives for the
    point (3,767 at C=8 on the default H200 / DeepSeek-V3.2; 16,384 at C=4, where the model does not fit),
    not the old 16,384 default."""
    COST.require()
    text = """[workload]
trace = "TRACE"
max_requests = 4

[grid]
cp_size = [4, 8]
policy = "rotation"

[[exclude]]
cp_size = 8
pages_per_lane = PAGES
"""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [0]}\n')
    text = text.replace("TRACE", str(trace))
    kept = prepare_points(read_grid(_grid(tmp_path, text.replace("PAGES", "16384")))).rows
    assert [(r["cp_size"], r["pages_per_lane"]) for r in kept] == [(4, 16384), (8, 3767)]  # excludes nothing
    kept = prepare_points(read_grid(_grid(tmp_path, text.replace("PAGES", "3767")))).rows
    assert [(r["cp_size"], r["pages_per_lane"]) for r in kept] == [(4, 16384)]


def test_the_grid_size_is_checked_before_anything_is_built(tmp_path, capsys):
    lists = "\n".join(
        f"{k} = [{', '.join(str(v) for v in range(1, n + 1))}]"
        for k, n in (("page_size", 1000), ("pages_per_lane", 1000), ("seed", 730))
    )
    grid = _grid(tmp_path, f'[workload]\nworkload = "synthetic"\n\n[grid]\n{lists}\npolicy = "balanced"\n')
    out = tmp_path / "out"
    t0 = time.monotonic()
    assert _sweep(grid, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"cpkv: error: {grid}: the grid has 730,000,000 points (1,000 page_size x 1,000 pages_per_lane x "
        "730 seed x 1 policy), above the limit of 100,000: narrow it, or raise the limit with --max-points"
    ]
    assert time.monotonic() - t0 < 20 and not out.exists()
    six = _grid(tmp_path, SMALL.replace("cp_size = 2", "cp_size = [2, 4]"), "six.toml")  # x 3 policies
    assert _sweep(six, out, "--max-points", "5") == 2
    assert "the grid has 6 points" in capsys.readouterr().err and not out.exists()
    assert len(read_grid(six, max_points=6).points()) == 6


def test_more_groups_than_requests_is_one_line_before_any_replay(tmp_path, capsys):
    grid = _grid(tmp_path, SMALL.replace("max_requests = 8", "max_requests = 10") + "groups = 10_000_000\n")
    t0 = time.monotonic()
    assert _sweep(grid, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"cpkv: error: {grid}: groups = 10,000,000 splits a workload of 10 requests: 9,999,990 groups "
        "would get none; at most one group per request"
    ]
    assert time.monotonic() - t0 < 30


# ----------------------------------------------------------------------------------- stored, designs
def test_non_owner_designs_are_one_row_of_the_designs_table(tmp_path, capsys):
    grid = _grid(
        tmp_path, SMALL + 'kv_storage = ["owner-lane", "replicated"]\npolicy = ["rotation", "balanced"]\n'
    )
    out = tmp_path / "out"
    assert _sweep(grid, out, "--workers", "2") == 0
    printed = capsys.readouterr().out
    assert "4 points: 3 replayed, 0 stored earlier, 0 failed" in printed  # replicated: one replay
    summary = _rows(out, "summary.csv")
    assert sorted((r["kv_storage"], r["policy"]) for r in summary) == [
        ("owner-lane", "balanced"),
        ("owner-lane", "rotation"),
        ("replicated", ""),
    ]
    table = [t for t in (line.split() for line in printed.splitlines()) if t and t[0] == "replicated"]
    assert len(table) == 1 and table[0][1] == "-", printed  # the console table: kv_storage, policy '-'


def test_stored_points_that_do_not_validate_are_replayed(tmp_path, capsys):
    grid = _grid(tmp_path, SMALL + 'policy = ["rotation", "balanced"]\n')
    out = tmp_path / "out"
    assert _sweep(grid, out, "--workers", "2") == 0
    assert "2 points: 2 replayed, 0 stored earlier, 0 failed" in capsys.readouterr().out
    good = (out / "results.csv").read_text()
    files = sorted((out / "points").glob("*.json"))
    record = json.loads(files[0].read_text())
    for bad in (
        {**record, "metrics": "x"},
        {**record, "metrics": None},
        {**record, "error": "oops"},
        {**record, "metrics": {"ttft_ms_p99": 1.0}},
        {**record, "per_group": 3},
        [record],
    ):
        files[0].write_text(json.dumps(bad))
        assert _sweep(grid, out) == 0
        assert "2 points: 1 replayed, 1 stored earlier, 0 failed" in capsys.readouterr().out
        assert (out / "results.csv").read_text() == good


# ------------------------------------------------------------------------------------------------ ray
def test_a_ray_address_that_does_not_answer_is_one_line_before_any_file(tmp_path, capsys, monkeypatch):
    RAY.require()
    grid = _grid(tmp_path, SMALL)
    out = tmp_path / "out"
    t0 = time.monotonic()
    assert _sweep(grid, out, "--executor", "ray", "--ray-address", "127.0.0.1:1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "cpkv: error: --ray-address 127.0.0.1:1: no Ray head answers at 127.0.0.1:1 within 10 s"
    ), err
    assert time.monotonic() - t0 < 30 and not out.exists()
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no-ray"))  # no cluster of this machine is found there
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _sweep(grid, out, "--executor", "ray", "--ray-address", "auto") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "cpkv: error: --ray-address auto: no Ray cluster runs on this machine"
    )
    assert not out.exists()


# --------------------------------------------------------------------------------------------- faults
def _children(pid: int) -> list[int]:
    """Pool workers of the driver ``pid`` (its spawned children)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [
        int(k)
        for k in kids
        if "multiprocessing" in _cmdline(int(k)) and "resource_tracker" not in _cmdline(int(k))
    ]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(grid: Path, out: Path, workers: int = 2) -> subprocess.Popen:
    cmd = [
        sys.executable,
        *DRIVER,
        "sweep",
        str(grid),
        "--out",
        str(out),
        "--no-progress",
        "--workers",
        str(workers),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_point(proc: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((out / "points").glob("*.json")):
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before its first point was stored"


def _state(tid: int, pid: int | None = None) -> tuple[str, str]:
    """Thread ``tid`` of process ``pid`` (default: its main thread): its state letter (``S`` asleep,
    ``T`` stopped, ...) and the first field of ``/proc/.../syscall`` (the number of the system call it is
    in, or ``running``); empty strings once it is gone."""
    task = Path(f"/proc/{tid if pid is None else pid}/task/{tid}")
    try:
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        call = (task / "syscall").read_text().split()[0]
    except (OSError, IndexError):
        return "", ""
    return state, call


def _until(what: str, done: Callable[[], bool], within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        time.sleep(0.01)


def _poll_call() -> str:
    """The system call number ``/proc/.../syscall`` shows for a thread of this interpreter asleep in
    ``select.poll`` (what the driver's ``multiprocessing.connection.wait`` sleeps in): ``poll`` or
    ``ppoll`` per platform, found by putting a thread of this process to sleep there."""
    r, w = os.pipe()
    poller = select.poll()
    poller.register(r, select.POLLIN)
    tids: list[int] = []

    def sleep() -> None:
        tids.append(threading.get_native_id())
        poller.poll()

    def asleep_in_poll() -> list[str]:  # its syscall fields once asleep on one fd (nfds, the 2nd arg, 0x1)
        task = Path(f"/proc/{os.getpid()}/task/{tids[0]}") if tids else None
        if task is None or _state(tids[0], os.getpid())[0] != "S":
            return []
        fields = (task / "syscall").read_text().split()
        return fields if len(fields) > 2 and fields[2] == "0x1" else []  # not the GIL's futex on the way

    thread = threading.Thread(target=sleep)
    thread.start()
    try:
        _until("a thread asleep in poll", lambda: bool(asleep_in_poll()))
        call = asleep_in_poll()[0]
    finally:
        os.write(w, b"x")
        thread.join()
        os.close(r)
        os.close(w)
    return call


def _hold_every_point_in_flight(proc: subprocess.Popen, workers: list[int]) -> None:
    """Stop the ``workers`` (SIGSTOP) and wait until the driver sleeps in its wait for their results. Then
    each worker holds a point the driver has not had back: the driver has read every result sent before
    the stop and handed that worker its next point (the queue is not empty), and a stopped worker sends
    nothing more. A worker killed now loses its point; one killed while its result was on the pipe
    would lose none (the flaky 24 ok of a bare kill)."""
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    for w in workers:
        _until(f"worker {w} stopped", lambda w=w: _state(w)[0] in ("T", "t"))
    poll = _poll_call()
    _until("the driver asleep waiting for its workers", lambda: _state(proc.pid) == ("S", poll))


@pytest.mark.slow
def test_a_killed_pool_worker_costs_only_its_own_point(tmp_path):
    grid, out = _grid(tmp_path, LONG), tmp_path / "out"
    proc = _start(grid, out)
    _first_point(proc, out)
    workers = _children(proc.pid)
    assert len(workers) == 2, workers
    _hold_every_point_in_flight(proc, workers)
    os.kill(workers[0], signal.SIGKILL)
    os.kill(workers[1], signal.SIGCONT)
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    rows = _rows(out)
    assert sorted(r["status"] for r in rows).count("ok") == 23, [r["status"] for r in rows]
    (lost,) = [r for r in rows if r["status"] != "ok"]
    assert lost["status"] == "lost" and lost["error"].startswith(
        "the worker was lost: the process running the point ended (signal 9)"
    )
    assert "24 points: 23 replayed, 0 stored earlier, 1 failed" in stdout
    again = subprocess.run(proc.args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "24 points: 1 replayed, 23 stored earlier, 0 failed" in again.stdout
    assert {r["status"] for r in _rows(out)} == {"ok"}


@pytest.mark.slow
def test_sigterm_writes_the_finished_points_exits_143_and_the_rerun_is_exact(tmp_path):
    grid, out = _grid(tmp_path, LONG), tmp_path / "out"
    proc = _start(grid, out)
    _first_point(proc, out)
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("cpkv: terminated: interrupted after "), err
    stored = len(list((out / "points").glob("*.json")))
    finished = [r for r in _rows(out) if r["status"] == "ok"]
    assert 1 <= stored == len(finished) < 24 and not list((out / "points").glob(".*"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(_alive, workers)):
        time.sleep(0.1)
    assert not any(map(_alive, workers))
    done = subprocess.run(proc.args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"24 points: {24 - stored} replayed, {stored} stored earlier, 0 failed" in done.stdout
    assert _sweep(grid, tmp_path / "whole", "--workers", "2") == 0  # uninterrupted: the same files
    for name in ("results.csv", "summary.csv"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


@pytest.mark.slow
def test_the_workers_exit_when_the_driver_is_killed(tmp_path):
    grid, out = _grid(tmp_path, LONG), tmp_path / "out"
    proc = _start(grid, out)
    _first_point(proc, out)
    workers = _children(proc.pid)
    assert len(workers) == 2
    proc.kill()  # SIGKILL: no handler, no cleanup in the driver
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(map(_alive, workers)):
        time.sleep(0.1)
    assert not any(map(_alive, workers)), [_cmdline(p) for p in workers if _alive(p)]
