"""Running a sweep: results identical whichever executor ran them, a re-run or a run after an
interruption replays only the points not stored, a failing point is recorded with its one-line error and
does not stop the sweep, keys name the whole config."""

import csv
import json
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cpkv.cli import main
from cpkv.sim.config import SimConfig
from cpkv.sweep import run as sweep_run
from cpkv.sweep.grid import read_grid
from cpkv.sweep.point import point_key
from cpkv.sweep.points import prepare_points
from extras import COST, RAY

pytestmark = pytest.mark.unit

GRID = """target = "ttft_ms_p99 <= 3000"

[workload]
workload = "synthetic"
max_requests = 16

[grid]
cp_size = [2, 4]
page_size = 16
pages_per_lane = [300, 1200]
policy = ["rotation", "balanced"]
groups = [1, 2]
cost_model = "illustrative"
"""  # 16 points


def _grid(tmp_path: Path, text: str = GRID) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


def _rows(out: Path) -> list[dict]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def _sweep(grid: Path, out: Path, *extra: str) -> int:
    return main(["sweep", str(grid), "--out", str(out), "--no-progress", *extra])


@pytest.mark.slow
def test_local_and_ray_give_identical_results(tmp_path):
    RAY.require()
    grid = _grid(tmp_path)
    assert _sweep(grid, tmp_path / "local", "--workers", "2") == 0
    assert _sweep(grid, tmp_path / "ray", "--executor", "ray", "--workers", "2") == 0
    for name in ("results.csv", "results.json", "summary.csv"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "ray" / name).read_bytes(), name
    rows = _rows(tmp_path / "ray")
    assert len(rows) == 16 and {r["status"] for r in rows} == {"ok"}
    assert sorted(p.name for p in (tmp_path / "ray" / "points").iterdir()) == sorted(
        f"{r['key']}.json" for r in rows
    )


def test_rerun_replays_nothing_and_an_interrupted_run_only_the_missing_points(tmp_path, monkeypatch, capsys):
    grid, out = _grid(tmp_path), tmp_path / "out"
    real = sweep_run.run_local
    seen: list[str] = []

    def interrupted(tasks, workloads, workers, on_result):  # Ctrl-C after the third result
        def counted(task, result):
            on_result(task, result)
            seen.append(task.key)
            if len(seen) == 3:
                raise KeyboardInterrupt

        real(tasks, workloads, workers, counted)

    monkeypatch.setattr(sweep_run, "run_local", interrupted)
    assert _sweep(grid, out, "--workers", "2") == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cpkv: aborted: interrupted after 3 of 16 points" in err, err
    assert len(list((out / "points").iterdir())) == 3
    partial = _rows(out)
    assert [r["status"] for r in partial].count("ok") == 3 and [r["status"] for r in partial].count(
        "not run"
    ) == 13
    assert json.loads((out / "results.json").read_text())["status"] == "interrupted"

    ran: list[str] = []

    def recording(tasks, workloads, workers, on_result):
        ran.extend(t.key for t in tasks)
        real(tasks, workloads, workers, on_result)

    monkeypatch.setattr(sweep_run, "run_local", recording)
    assert _sweep(grid, out, "--workers", "2") == 0
    assert len(ran) == 13 and not set(ran) & set(seen)  # only the missing points
    assert "16 points: 13 replayed, 3 stored earlier, 0 failed" in capsys.readouterr().out
    full = _rows(out)
    ran.clear()
    assert _sweep(grid, out) == 0
    assert ran == []  # finished: nothing replayed
    assert _rows(out) == full
    assert json.loads((out / "results.json").read_text())["status"] == "complete"
    assert not [p for p in out.rglob(".*")]  # no temporary file left


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_and_keeps_the_finished_points(tmp_path):
    # A real SIGINT to `cpkv sweep` (workers ignore it: the driver stops them), then the same command again.
    grid = _grid(
        tmp_path,
        GRID.replace("max_requests = 16", "max_requests = 60").replace(
            "groups = [1, 2]", "groups = [1, 2, 3]"
        ),
    )
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-c",
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from cpkv.cli import main; sys.exit(main(sys.argv[1:]))",
        "sweep",
        str(grid),
        "--out",
        str(out),
        "--no-progress",
        "--workers",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((out / "points").glob("*.json")):  # the first stored point
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.splitlines()[-1].startswith("cpkv: aborted: interrupted after "), err
    stored = len(list((out / "points").glob("*.json")))
    assert 1 <= stored < 24 and not list((out / "points").glob(".*"))  # no temporary file left
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"24 points: {24 - stored} replayed, {stored} stored earlier, 0 failed" in done.stdout


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    # cp_size 2 with four per-lane sizes fails making its config; 2**40 pages per lane passes the config but
    # not the replay's memory bound (in the worker); the other points run.
    grid = _grid(
        tmp_path,
        GRID.replace("pages_per_lane = [300, 1200]", 'pages_per_lane = ["300,300,300,300", 1099511627776]')
        .replace("groups = [1, 2]", "groups = 1")
        .replace('policy = ["rotation", "balanced"]', 'policy = "balanced"'),
    )
    out = tmp_path / "out"
    assert _sweep(grid, out) == 0
    rows = {(r["cp_size"], r["pages_per_lane"]): r for r in _rows(out)}
    assert rows["4", "300,300,300,300"]["status"] == "ok"
    bad = rows["2", "300,300,300,300"]
    assert (
        bad["status"] == "failed"
        and bad["error"] == "ConfigError: pages_per_lane has 4 entries, cp_size=2 needs 2"
    )
    assert bad["key"] == ""  # no config, nothing stored: re-derived (in a moment) by every run
    for cp in ("2", "4"):
        huge = rows[cp, "1099511627776"]
        assert (
            huge["status"] == "failed"
            and "\n" not in huge["error"]
            and huge["error"].startswith("ConfigError: an allocator of")
        ), huge
    assert "4 points: 3 replayed, 0 stored earlier, 3 failed" in capsys.readouterr().out
    assert _sweep(grid, out) == 0  # a stored failure is a result: not replayed again
    assert "4 points: 0 replayed, 3 stored earlier, 3 failed" in capsys.readouterr().out
    assert _sweep(grid, out, "--retry-failed") == 0
    assert "4 points: 2 replayed, 1 stored earlier, 3 failed" in capsys.readouterr().out


def test_every_point_failing_is_an_error(tmp_path, capsys):
    grid = _grid(tmp_path, GRID.replace("pages_per_lane = [300, 1200]", 'pages_per_lane = "1,1,1"'))
    assert _sweep(grid, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no point of" in err and "ConfigError: pages_per_lane" in err


@pytest.mark.clause("C-COST")  # results compare only when their cost provenance agrees: it is in the key
def test_the_key_names_the_whole_config():
    cfg = SimConfig(cp_size=4, page_size=16)
    prov = {"cost_model": "illustrative"}
    key = point_key("d", cfg, "balanced", 2, "round-robin", prov)
    assert key == point_key("d", SimConfig(cp_size=4, page_size=16), "balanced", 2, "round-robin", dict(prov))
    others = [
        point_key("e", cfg, "balanced", 2, "round-robin", prov),
        point_key("d", replace(cfg, chunk_size=4096), "balanced", 2, "round-robin", prov),
        point_key("d", replace(cfg, seed=1), "balanced", 2, "round-robin", prov),
        point_key("d", cfg, "rotation", 2, "round-robin", prov),
        point_key("d", cfg, "balanced", 3, "round-robin", prov),
        point_key("d", cfg, "balanced", 2, "prefix", prov),
        point_key("d", cfg, "balanced", 2, "round-robin", {"cost_model": "measured", "tables_sha256": "x"}),
    ]
    assert len({key, *others}) == 1 + len(others)
    # one group routes nothing: the routing does not change its key
    assert point_key("d", cfg, "balanced", 1, "prefix", prov) == point_key(
        "d", cfg, "balanced", 1, "round-robin", prov
    )


def test_points_with_one_config_replay_once(tmp_path):
    # One group routes nothing: its two routings are one config, one replay, two rows.
    grid = read_grid(
        _grid(
            tmp_path, GRID.replace("groups = [1, 2]", 'groups = [1, 2]\nrouting = ["round-robin", "prefix"]')
        )
    )
    plan = prepare_points(grid)
    assert len(plan.rows) == 32 and len(plan.tasks) == 8 * 3
    one = [r for r in plan.rows if r["groups"] == 1]
    assert len({r["key"] for r in one}) == len(one) // 2


def test_ray_missing_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert _sweep(_grid(tmp_path), tmp_path / "out", "--executor", "ray") == 2
    err = capsys.readouterr().err
    assert err == (
        "cpkv: error: --executor ray needs Ray: pip install '.[ray]' in a cpkv checkout "
        "(or use --executor local)\n"
    )
    assert not (tmp_path / "out").exists()  # before any work


@pytest.mark.clause("C-STORAGE")
def test_a_storage_axis_replays_each_design_as_simulate_does(tmp_path):
    """``kv_storage`` through the real, repeatable ``--kv-storage`` option: each point is one design (a
    design other than owner-lane replays once for both policies), and its metrics are those of ``cpkv
    simulate --kv-storage`` on the same settings."""
    grid = _grid(
        tmp_path,
        GRID.replace("cp_size = [2, 4]", "cp_size = 4")
        .replace("[300, 1200]", "300")
        .replace("groups = [1, 2]", 'groups = 1\nkv_storage = ["owner-lane", "replicated"]'),
    )
    assert _sweep(grid, tmp_path / "out") == 0
    listed = _rows(tmp_path / "out")  # a design other than owner-lane has no policy: its column is empty
    assert sorted((r["kv_storage"], r["policy"]) for r in listed) == [
        ("owner-lane", "balanced"),
        ("owner-lane", "rotation"),
        ("replicated", ""),
        ("replicated", ""),
    ]
    assert {r["status"] for r in listed} == {"ok"}
    assert len({r["key"] for r in listed if r["kv_storage"] == "replicated"}) == 1
    rows = {(r["kv_storage"], r["policy"] or "rotation"): r for r in listed if r["policy"] != "balanced"}
    assert len(list((tmp_path / "out" / "points").iterdir())) == 3
    sim = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--workload",
                "synthetic",
                "--max-requests",
                "16",
                "--cp-size",
                "4",
                "--page-size",
                "16",
                "--pages-per-lane",
                "300",
                "--cost-model",
                "illustrative",
                "--policy",
                "rotation",
                "--kv-storage",
                "owner-lane",
                "--kv-storage",
                "replicated",
                "--no-progress",
                "--out",
                str(sim),
            ]
        )
        == 0
    )
    report = json.loads((sim / "report.json").read_text())["policies"]
    for (design, policy), name in (
        (("owner-lane", "rotation"), "owner-lane/rotation"),
        (("replicated", "rotation"), "replicated"),
    ):
        for field in ("cache_hit_tokens", "prefill_tokens", "evicted_pages", "kv_capacity_tokens"):
            assert int(rows[design, policy][field]) == report[name][field], (design, field)
        p99 = rows[design, policy]["ttft_ms_p99"]  # empty where it falls on an unfinished (rejected) request
        want = report[name]["ttft_ms_p99"]
        assert (p99 == "" and want is None) or float(p99) == pytest.approx(want, rel=1e-9)


@pytest.mark.clause("C-COST")
def test_workers_price_with_the_drivers_tables(tmp_path):
    """The driver prices each cp_size's measured tables once and ships them with the workloads: a worker
    process replays its points without importing aiconfigurator, with the driver's own results."""
    COST.require()
    import pickle

    from cpkv.cost import MeasuredSpec
    from cpkv.sweep.point import Shipment, run_task

    text = GRID.replace('cost_model = "illustrative"', "").replace("groups = [1, 2]", "groups = 1")
    plan = prepare_points(read_grid(_grid(tmp_path, text.replace("max_requests = 16", "max_requests = 6"))))
    assert set(plan.price_tables) == {(MeasuredSpec(), 2), (MeasuredSpec(), 4)}
    tasks = [t for t in plan.tasks.values() if t.config.pages_per_lane == 300 and t.policy == "balanced"]
    (tmp_path / "shipment.pkl").write_bytes(
        pickle.dumps((Shipment(plan.workloads, plan.price_tables), tasks))
    )
    child = f"""
import json, pickle, sys
from cpkv.sweep.point import run_task
shipment, tasks = pickle.loads(open({str(tmp_path / "shipment.pkl")!r}, "rb").read())
workloads = shipment.unpack()
out = [run_task(t, workloads)["metrics"] for t in tasks]
print(json.dumps([out, "aiconfigurator_core" in sys.modules]))
"""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    there, imported = json.loads(proc.stdout)
    here = [run_task(t, plan.workloads)["metrics"] for t in tasks]
    assert len(here) == 2 and imported is False
    for a, b in zip(here, there, strict=True):
        a.pop("sim_wall_s"), b.pop("sim_wall_s")
        assert json.loads(json.dumps(a)) == b
