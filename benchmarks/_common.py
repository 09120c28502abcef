"""Helpers shared by the benchmark scripts: timing, the memory bound, machine facts, table and JSON output.

Every figure is a median over repeated runs in one process; ratios compare figures of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def parser(description: str) -> argparse.ArgumentParser:
    """An argparse parser with the flags every benchmark has: ``--quick`` and ``--json PATH``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny sizes, for CI: checks that the script runs")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    return p


def median_s(fn: Callable[[], object], repeats: int, setup: Callable[[], object] | None = None) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs; ``setup()`` runs untimed before each."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bound_s(nbytes: int, repeats: int) -> float:
    """The memory bound: median seconds to write ``nbytes`` once, ``np.copyto`` of int64 into a
    preallocated buffer (both buffers touched beforehand, so no page faults are timed)."""
    n = max(1, nbytes // 8)
    src = np.arange(n, dtype=np.int64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    return median_s(lambda: np.copyto(dst, src), repeats)


def fresh_copy_s(nbytes: int, repeats: int) -> float:
    """Median seconds of ``src.copy()`` of ``nbytes``: the bound plus the first touch of a new array."""
    src = np.arange(max(1, nbytes // 8), dtype=np.int64)
    return median_s(src.copy, repeats)


def machine() -> dict[str, object]:
    """CPU model, ``nproc``, thread settings and library versions, for the README table."""
    import torch

    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = {k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS")}
    return {
        "cpu": model,
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "env": threads,
    }


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a plain-text table: a title line, the header, a rule and one line per row."""
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    print(title)
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    sys.stdout.flush()


def write_json(path: Path | None, payload: dict) -> None:
    """Write ``payload`` plus the machine facts to ``path`` (nothing when ``path`` is None)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")


def fmt(v: object) -> str:
    """A table cell: floats to 3 significant digits (thousands separated above 1000), ints separated."""
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
