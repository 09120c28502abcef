"""The simulator on the Mooncake conversation trace: wall time, requests/s, peak RSS; cost models compared.

    python benchmarks/bench_simulate.py [--quick] [--max-requests N] [--policy rotation|all] [--scale N [--seed S]]
                                        [--cost-model measured|illustrative] [--compare-costs ROUNDS] [--json PATH]

Runs the real CLI in a child process, exactly
``cpkv simulate --trace ../shared/traces/mooncake_conversation_trace.jsonl --policy P --no-progress
--cost-model M --out DIR``
(``--quick``: plus ``--max-requests 200``), so the peak RSS is that of the command alone (interpreter and
imports included; ``simulate`` does not import torch). "wall" is the child's wall time from start to
exit, "sim" the ``sim_wall_s`` of its report summed over its policies (the step loop only).
``--compare-costs N`` runs the command N times under each cost model, alternated (measured,
illustrative, measured, ...), and prints each run and the ratio of the medians (issue 25's acceptance:
the measured replay within 1.5x of the illustrative one). ``--accounting ROUNDS`` runs it ROUNDS times
with the owner-lane storage accounting (remote reads, recomputed tokens: ``sim.storage``) and as often
without it (its three hooks made no-ops in the child), alternated, and prints the ratio of the median
step loops (issue 38: at most 1.05x) and of the children's CPU seconds. ``--scale N`` replays, in place of the
Mooncake trace, a synthetic trace of N requests with its statistics (``cpkv.sim.synthetic_trace``; written once to
``$TMPDIR/cpkv-bench/scale-N-S.jsonl`` and reused): the day-scale replay of issue 38 (1,000,000 requests
under 8 minutes and 1.5 GB peak RSS; 2,000,000 within 1.2x of that RSS). See README.md.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, parser, print_table, write_json

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
ENTRY = (
    "import resource, sys; from cpkv.cli import main; rc = main(); "
    "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)"
)
NO_ACCOUNTING = (
    "from cpkv.sim.storage.base import KVStorage; from cpkv.sim.storage.owner_lane import OwnerLaneStorage; "
    "OwnerLaneStorage.step_traffic = lambda self, rows, allocation: 0.0; "
    "KVStorage.admitted = lambda self, run: None; KVStorage.retired = lambda self, run, n: None; "
)
"""Prepended to ``ENTRY`` for a replay without the owner-lane accounting (``--accounting``)."""
HEADER = [
    "cost model",
    "policy",
    "requests",
    "finished",
    "wall s",
    "sim s",
    "req/s (wall)",
    "req/s (sim)",
    "peak RSS MiB",
    "TTFT p50 ms",
    "TTFT p99 ms",
]


def run(args, cost_model: str, cap: int | None, entry: str = ENTRY) -> tuple[list, dict]:
    """One child ``cpkv simulate`` (``entry``: the child's program): its table row and its figures."""
    with tempfile.TemporaryDirectory() as out_dir:
        cmd = [
            "simulate",
            "--trace",
            str(args.trace),
            "--policy",
            args.policy,
            "--no-progress",
            "--cost-model",
            cost_model,
            "--out",
            out_dir,
        ] + (["--max-requests", str(cap)] if cap else [])
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", entry, *cmd], cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            sys.exit(f"cpkv simulate failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        report = json.loads((Path(out_dir) / "report.json").read_text())
    rss_mib = int(proc.stderr.rsplit("peak_rss_kib", 1)[1].split()[0]) / 1024  # Linux: KiB
    policies = report["policies"]
    n = sum(m["requests_total"] for m in policies.values())
    sim = sum(m["sim_wall_s"] for m in policies.values())
    ttft = [(m["ttft_ms_p50"], m["ttft_ms_p99"]) for m in policies.values()]
    row = [
        cost_model,
        args.policy,
        n,
        sum(m["requests_finished"] for m in policies.values()),
        wall,
        sim,
        n / wall,
        n / sim if sim else 0.0,
        rss_mib,
        " / ".join(f"{a:,.0f}" for a, _ in ttft),
        " / ".join(f"{b:,.0f}" for _, b in ttft),
    ]
    return row, {
        "command": ["cpkv", *cmd],
        "wall_s": wall,
        "cpu_s": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
        "sim_wall_s": sim,
        "requests": n,
        "peak_rss_mib": rss_mib,
        "metrics": policies,
        "cost_provenance": report["config"]["cost_provenance"],
    }


def accounting(args, cap: int | None, title: str) -> None:
    """``--accounting ROUNDS``: the replay with and without the owner-lane accounting, alternated."""
    rows, figures = [], {"with": [], "without": []}
    for _ in range(args.accounting):
        for mode, entry in (("with", ENTRY), ("without", NO_ACCOUNTING + ENTRY)):
            row, fig = run(args, args.cost_model, cap, entry)
            rows.append([f"{mode} accounting", *row])
            figures[mode].append(fig)
    print_table(f"{title}, owner-lane accounting on and off, alternated", ["run", *HEADER], rows)

    def median(mode: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[mode])

    sim = median("with", "sim_wall_s") / median("without", "sim_wall_s")
    cpu = median("with", "cpu_s") / median("without", "cpu_s")
    print(
        f"median step loop: with the accounting {median('with', 'sim_wall_s'):.2f} s, without "
        f"{median('without', 'sim_wall_s'):.2f} s: {sim:.3f}x (target <= 1.05); child CPU "
        f"{median('with', 'cpu_s'):.2f} s against {median('without', 'cpu_s'):.2f} s: {cpu:.3f}x"
    )
    write_json(
        args.json,
        {
            "benchmark": "simulate-accounting",
            "quick": args.quick,
            "sim_ratio": sim,
            "cpu_ratio": cpu,
            **{
                mode: [{k: f[k] for k in ("wall_s", "cpu_s", "sim_wall_s")} for f in fs]
                for mode, fs in figures.items()
            },
        },
    )


def scale_trace(n: int, seed: int) -> Path:
    """The synthetic trace of ``n`` requests (``cpkv.sim.synthetic_trace``), written under
    ``$TMPDIR/cpkv-bench`` the first time and reused after."""
    from cpkv.sim.synthetic_trace import write_synthetic_trace

    path = Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / "cpkv-bench" / f"scale-{n}-{seed}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        write_synthetic_trace(path, n, seed)
        print(f"wrote {path} ({path.stat().st_size / 2**20:,.0f} MiB) in {time.perf_counter() - t0:.1f} s")
    return path


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--max-requests", type=int, default=None, help="cap on trace lines (--quick: 200)")
    p.add_argument("--policy", default="rotation", help="owner policy, or all (default rotation)")
    p.add_argument(
        "--cost-model", default="measured", choices=["measured", "illustrative"], help="default measured"
    )
    p.add_argument(
        "--compare-costs",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="run ROUNDS times per cost model, alternated, and compare their wall times",
    )
    p.add_argument(
        "--accounting",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="run ROUNDS times with and without the owner-lane accounting, alternated, and compare",
    )
    p.add_argument("--trace", type=Path, default=TRACE, help="trace (default: the shared Mooncake trace)")
    p.add_argument(
        "--scale",
        type=int,
        default=None,
        metavar="N",
        help="replay a synthetic Mooncake-like trace of N requests",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the --scale trace (default 0)")
    args = p.parse_args()
    cap = args.max_requests or (200 if args.quick else None)
    title = f"cpkv simulate {args.trace.name} (targets: full trace <= 60 s, <= 2048 MiB)"
    if args.accounting:
        accounting(args, cap, title)
        return

    if args.scale is not None:
        args.trace = scale_trace(args.scale, args.seed)
        title = f"cpkv simulate {args.trace.name} (targets at 1,000,000: <= 480 s, <= 1536 MiB)"
    if not args.compare_costs:
        row, figures = run(args, args.cost_model, cap)
        print_table(title, HEADER, [row])
        write_json(args.json, {"benchmark": "simulate", "quick": args.quick, "scale": args.scale, **figures})
        return
    rows, walls = [], {"measured": [], "illustrative": []}
    for _ in range(args.compare_costs):
        for model in walls:
            row, _ = run(args, model, cap)
            rows.append(row)
            walls[model].append(row[4])
    print_table(f"{title}, cost models alternated", HEADER, rows)
    ratio = statistics.median(walls["measured"]) / statistics.median(walls["illustrative"])
    print(
        f"median wall: measured {statistics.median(walls['measured']):.2f} s, illustrative "
        f"{statistics.median(walls['illustrative']):.2f} s: ratio {ratio:.2f} (target <= 1.5)"
    )
    write_json(
        args.json, {"benchmark": "simulate-costs", "quick": args.quick, "walls_s": walls, "ratio": ratio}
    )


if __name__ == "__main__":
    main()
