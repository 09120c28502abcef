"""``cpkv sweep`` wall time with 1 and 2 workers (and Ray), and a re-run that finds every point stored.

    python benchmarks/bench_sweep.py [--quick] [--grid FILE] [--workers 1,2] [--rounds N] [--ray [--ray-address ADDR]]
                                     [--json PATH]

Runs the real CLI in a child process, exactly ``cpkv sweep GRID --out DIR --no-progress --workers W``
(each run into a fresh DIR, so every point is replayed), for each worker count in turn, ``--rounds`` times
alternated (1, 2, 1, 2, ...); then the same command once more into the last DIR, where every point is
stored (the acceptance: it replays nothing and exits in seconds). ``--ray`` adds ``--executor ray`` runs
at the same worker counts (a Ray it starts itself: about 5 s of its own start and stop in every run;
``--ray-address`` a running one, e.g. ``ray start --head --num-cpus 2`` and ``auto``).
Each run's speed-up is against the median wall time of its own executor with the first worker count;
with ``--ray``, each worker count's median Ray wall time is also compared with the local one (issue 38:
within 1.15x on a running cluster), and Ray's own start-up is timed first, in a child process:
``ray.init`` of a local Ray of the largest worker count (as ``cpkv sweep`` starts it), its first actor
ready, ``ray.shutdown``; with ``--ray-address``, joining that cluster instead.
Every run's ``results.csv`` must be identical (the script fails otherwise). The load average before and
after each run is printed, and the CPU seconds the run's processes used (the sweep's own and its
workers'; Ray's workers are not children it waits for: ``-``): the speed-up only means something on a
quiet machine.

Default grid: examples/sweep_mooncake.toml (its trace path made absolute).
``--quick``: a 16-point synthetic grid, illustrative costs (CI checks that the script runs).
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, parser, print_table, write_json

EXAMPLE = ROOT / "examples" / "sweep_mooncake.toml"
QUICK = """[workload]
workload = "synthetic"
max_requests = 24
[grid]
cp_size = [2, 4]
page_size = 16
pages_per_lane = [300, 1200]
policy = ["rotation", "balanced"]
groups = [1, 2]
cost_model = "illustrative"
"""


def prepared_grid(path: Path, tmp: Path) -> Path:
    """The grid to run: ``path`` with its trace path made absolute, written under ``tmp``."""
    text = path.read_text()
    base = path.parent
    text = re.sub(
        r'^(trace\s*=\s*)"([^"]+)"', lambda m: f'{m[1]}"{(base / m[2]).resolve()}"', text, flags=re.M
    )
    out = tmp / path.name
    out.write_text(text)
    return out


def run(grid: Path, out: Path, workers: int, executor: str, ray_address: str | None = None) -> dict:
    """One child ``cpkv sweep``: wall time, load averages, its summary line and results.csv."""
    cmd = [
        sys.executable,
        "-m",
        "cpkv.cli",
        "sweep",
        str(grid),
        "--out",
        str(out),
        "--no-progress",
        "--workers",
        str(workers),
        "--executor",
        executor,
    ]
    if executor == "ray" and ray_address:
        cmd += ["--ray-address", ray_address]
    load0 = os.getloadavg()[0]
    cpu0 = _children_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    cpu = _children_cpu_s() - cpu0
    if proc.returncode != 0:
        sys.exit(f"cpkv sweep failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    line = next(s for s in proc.stdout.splitlines() if " points: " in s)
    return {
        "executor": executor,
        "workers": workers,
        "wall_s": wall,
        "cpu_s": cpu if executor == "local" else None,  # Ray's workers are not waited-for children
        "load_before": load0,
        "load_after": os.getloadavg()[0],
        "summary": line.split("; wrote")[0],
        "csv": (out / "results.csv").read_bytes(),
    }


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children (and theirs, once waited for)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


RAY_STARTUP = """
import json, sys, time
t0 = time.perf_counter()
import ray
t1 = time.perf_counter()
address, cpus = sys.argv[1] or None, int(sys.argv[2])
local = {} if address else {"num_cpus": cpus, "object_store_memory": 256 * 2**20}
ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR", **local)
t2 = time.perf_counter()
ray.get(ray.remote(num_cpus=1)(type("Ping", (), {"ping": lambda self: 1})).remote().ping.remote())
t3 = time.perf_counter()
ray.shutdown()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "init_s": t2 - t1, "first_actor_s": t3 - t2, "shutdown_s": t4 - t3}))
"""


def ray_startup(address: str | None, cpus: int) -> dict:
    """Ray's start-up in a child process (see the module docstring): seconds of ``import ray``, ``ray.init``,
    the first actor's first call, ``ray.shutdown``, and the whole child."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", RAY_STARTUP, address or "", str(cpus)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"Ray start-up failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return {**json.loads(proc.stdout.splitlines()[-1]), "child_s": wall, "load_before": load0}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--grid", type=Path, default=EXAMPLE)
    p.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--ray", action="store_true", help="also run --executor ray")
    p.add_argument("--ray-address", help="the Ray runs join this cluster (default: each starts its own)")
    args = p.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    startup = ray_startup(args.ray_address, max(counts)) if args.ray else None
    if startup:
        what = f"joining {args.ray_address}" if args.ray_address else f"a local Ray of {max(counts)} CPUs"
        print(
            f"Ray start-up ({what}), load average {startup['load_before']:.2f}: import {startup['import_s']:.2f} s, "
            f"ray.init {startup['init_s']:.2f} s, first actor {startup['first_actor_s']:.2f} s, shutdown "
            f"{startup['shutdown_s']:.2f} s; the whole child {startup['child_s']:.2f} s"
        )
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if args.quick:
            grid, note = tmp / "quick.toml", " (quick: synthetic, illustrative)"
            grid.write_text(QUICK)
        else:
            grid, note = prepared_grid(args.grid, tmp), ""
        executors = ["local", "ray"] if args.ray else ["local"]
        runs = [
            run(grid, tmp / f"out-{r}-{executor}-{w}", w, executor, args.ray_address)
            for r in range(args.rounds)
            for executor in executors
            for w in counts
        ]
        again = run(grid, tmp / f"out-{args.rounds - 1}-local-{counts[-1]}", counts[-1], "local")
    if len({x["csv"] for x in runs + [again]}) != 1:
        sys.exit("results.csv differs between runs")

    def median_wall(executor: str, workers: int) -> float:
        return statistics.median(
            x["wall_s"] for x in runs if x["workers"] == workers and x["executor"] == executor
        )

    base = {executor: median_wall(executor, counts[0]) for executor in executors}
    rows = [
        [
            x["executor"],
            x["workers"],
            x["wall_s"],
            base[x["executor"]] / x["wall_s"],
            "-" if x["cpu_s"] is None else x["cpu_s"],
            x["load_before"],
            x["load_after"],
            x["summary"],
        ]
        for x in runs
    ]
    rows.append(
        [
            "local (re-run)",
            again["workers"],
            again["wall_s"],
            "-",
            again["cpu_s"],
            again["load_before"],
            again["load_after"],
            again["summary"],
        ]
    )
    print_table(
        f"cpkv sweep {args.grid.name if not args.quick else 'quick'}{note}; results.csv identical in every run",
        [
            "executor",
            "workers",
            "wall s",
            f"speed-up vs {counts[0]} (same executor)",
            "CPU s",
            "load before",
            "load after",
            "sweep",
        ],
        rows,
    )
    for executor in executors:
        for w in counts[1:]:
            wall = median_wall(executor, w)
            print(
                f"{executor}: median wall {base[executor]:.1f} s with {counts[0]} worker(s), {wall:.1f} s with {w}: "
                f"speed-up {base[executor] / wall:.2f}x"
            )
    if args.ray:
        for w in counts:
            ratio = median_wall("ray", w) / median_wall("local", w)
            print(
                f"{w} worker(s): median wall ray {median_wall('ray', w):.1f} s, local {median_wall('local', w):.1f} s: "
                f"ray / local {ratio:.2f}x (target on a running cluster: <= 1.15x)"
            )
    write_json(
        args.json,
        {
            "quick": args.quick,
            "note": note,
            "ray_startup": startup,
            "runs": [{k: v for k, v in x.items() if k != "csv"} for x in runs + [again]],
        },
    )


if __name__ == "__main__":
    main()
