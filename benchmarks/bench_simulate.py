"""The simulator on the Mooncake conversation trace under one policy: wall time, requests/s, peak RSS.

    python benchmarks/bench_simulate.py [--quick] [--max-requests N] [--policy rotation] [--json PATH]

Runs the real CLI in a child process, exactly
``cpkv simulate --trace ../shared/traces/mooncake_conversation_trace.jsonl --policy P --no-progress
--out DIR``
(``--quick``: plus ``--max-requests 200``), so the peak RSS is that of the command alone (interpreter and
imports included; ``simulate`` does not import torch). "wall" is the child's wall time from start to
exit, "sim" the ``sim_wall_s`` of its report (the step loop only). See README.md.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, parser, print_table, write_json

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
ENTRY = "import sys; from cpkv.cli import main; sys.exit(main())"


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--max-requests", type=int, default=None, help="cap on trace lines (--quick: 200)")
    p.add_argument("--policy", default="rotation", help="owner policy (default rotation)")
    p.add_argument("--trace", type=Path, default=TRACE, help="trace (default: the shared Mooncake trace)")
    args = p.parse_args()
    cap = args.max_requests or (200 if args.quick else None)
    with tempfile.TemporaryDirectory() as out_dir:
        cmd = ["simulate", "--trace", str(args.trace), "--policy", args.policy, "--no-progress"]
        cmd += ["--out", out_dir] + (["--max-requests", str(cap)] if cap else [])
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", ENTRY, *cmd], cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"cpkv simulate failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        report = json.loads((Path(out_dir) / "report.json").read_text())
    rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB
    metrics = report["policies"][args.policy]
    n, sim = metrics["requests_total"], metrics["sim_wall_s"]
    row = [args.policy, n, metrics["requests_finished"], wall, sim, n / wall, n / sim if sim else 0.0,
           rss_mib]  # fmt: skip
    header = ["policy", "requests", "finished", "wall s", "sim s", "req/s (wall)", "req/s (sim)",
              "peak RSS MiB"]  # fmt: skip
    print_table(f"cpkv simulate {args.trace.name} (targets: full trace <= 60 s, <= 2048 MiB)", header, [row])
    write_json(args.json, {"benchmark": "simulate", "quick": args.quick, "command": ["cpkv", *cmd],
                           "wall_s": wall, "sim_wall_s": sim, "requests": n, "peak_rss_mib": rss_mib,
                           "metrics": metrics})  # fmt: skip


if __name__ == "__main__":
    main()
