"""Simulator outputs: ``report.json``, ``config.json``, ``summary.csv``, ``lanes.png`` and the side-by-side table.

Files are written to temporary names in the output directory and renamed into place only when every
file is complete, so a failed run never leaves a half-written report.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPORT_FIELDS = (
    "requests_total", "requests_finished", "requests_rejected", "prefill_tokens", "cache_hit_tokens",
    "lane_pages_peak", "lane_imbalance_peak", "lane_imbalance_mean", "compute_imbalance_mean",
    "owner_lane_exhausted", "load_back_owner_lane_capacity_failed", "evicted_pages", "livelock_detected",
    "ttft_ms_p50", "ttft_ms_p99", "sim_wall_s",
)  # fmt: skip
"""Metrics every policy's entry in ``report.json`` carries (issue 8; formulas in docs/metrics.md)."""


OUTPUT_FILES = ("report.json", "config.json", "summary.csv", "lanes.png")
"""Files ``write_outputs`` puts into the output directory."""


@dataclass
class PolicyResult:
    """One policy's replay: ``metrics`` (JSON-ready dict with at least ``REPORT_FIELDS``), and the lane
    timeline for the plot: ``times_ms`` float ``[steps]`` and ``used`` int ``[steps, C]`` pages."""

    policy: str
    metrics: dict
    times_ms: np.ndarray = field(repr=False)
    used: np.ndarray = field(repr=False)


def write_outputs(out_dir: Path, config: dict, results: list[PolicyResult]) -> list[Path]:
    """Write ``report.json``, ``config.json``, ``summary.csv`` and ``lanes.png`` into ``out_dir``.

    ``report.json`` is ``{"config": {...}, "policies": {"<policy>": {metrics}}}``. Returns the paths.
    Raises OSError when the directory cannot be written; nothing is left half-written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"config": config, "policies": {r.policy: r.metrics for r in results}}
    payloads = {  # keys: OUTPUT_FILES
        "report.json": json.dumps(report, indent=2).encode(),
        "config.json": json.dumps(config, indent=2).encode(),
        "summary.csv": _summary_csv(results).encode(),
        "lanes.png": _lanes_png(results, config),
    }
    blocked = [name for name in payloads if (out_dir / name).is_dir()]
    if blocked:
        raise IsADirectoryError(f"{out_dir}: {', '.join(blocked)} is a directory; nothing was written")
    umask = os.umask(0)
    os.umask(umask)
    tmp_paths = {}
    try:
        for name, data in payloads.items():  # every file complete on disk before any is replaced
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out_dir)
            tmp_paths[name] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o666 & ~umask)
        for name, tmp in tmp_paths.items():
            os.replace(tmp, out_dir / name)
    finally:
        for tmp in tmp_paths.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
    return [out_dir / name for name in payloads]


def _summary_csv(results: list[PolicyResult]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["policy", *REPORT_FIELDS])
    for r in results:
        row = [r.metrics.get(k) for k in REPORT_FIELDS]
        writer.writerow([r.policy, *(" ".join(map(str, v)) if isinstance(v, list) else v for v in row)])
    return buf.getvalue()


def _lanes_png(results: list[PolicyResult], config: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(results), 1)
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.6 * n), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=False):
        step = max(1, r.used.shape[0] // 2000)  # at most ~2000 points per line
        t = r.times_ms[::step] / 1000.0
        for lane in range(r.used.shape[1]):
            ax.plot(t, r.used[::step, lane], lw=0.9, label=f"lane {lane}")
        ax.axhline(config.get("pages_per_lane", 0), color="k", lw=0.6, ls="--")
        flag = "  LIVELOCK" if r.metrics.get("livelock_detected") else ""
        ax.set_title(
            f"{r.policy}: lane_imbalance_peak {r.metrics['lane_imbalance_peak']:.2f}{flag}", fontsize=10, loc="left"
        )
        ax.set_ylabel("used pages")
    axes[-1, 0].set_xlabel("simulated time (s)")
    axes[0, 0].legend(ncol=min(8, results[0].used.shape[1]) if results else 1, fontsize=7, loc="upper right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def format_value(value: object) -> str:
    """Short text for one metric in the side-by-side table."""
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, list):
        return " ".join(map(str, value))
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def print_table(results: list[PolicyResult], title: str) -> None:
    """Print the metrics of every policy side by side (rich table, one column per policy)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("metric")
    for r in results:
        table.add_column(r.policy, justify="right", overflow="fold")
    for key in REPORT_FIELDS:
        table.add_row(key, *(format_value(r.metrics.get(key)) for r in results))
    Console(width=None if os.isatty(1) else 140).print(table)
