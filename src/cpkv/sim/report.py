"""Simulator outputs: ``report.json``, ``config.json``, ``summary.csv``, ``lanes.png`` (and ``storage.png`` when
KV storage designs are compared) and the side-by-side table.

Nothing is lost on a failed write: the output directory is created and probed before the replay
(``prepare_out_dir``), every file is written to a temporary name in that directory and renamed into place
on its own (a reader sees the old file or the new one, never half of one), and a file that cannot be
written is named in a ``ReportWriteError`` after the others were written.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CpkvError
from .metrics import CORE, SPEC, STORAGE, metric_names

REPORT_FIELDS = metric_names(column=CORE)
"""Metrics every policy's entry in ``report.json`` carries and the table and ``summary.csv`` show, in order
(``sim.metrics.METRICS``; formulas in docs/metrics.md)."""

SPEC_DECODE_FIELDS = metric_names(column=SPEC)
"""Also in the table and ``summary.csv`` when the run decoded speculatively (``--spec-draft-tokens``)."""

STORAGE_FIELDS = metric_names(column=STORAGE)
"""Every entry of ``report.json`` carries them; also in the table and ``summary.csv`` when the run compares KV
storage designs (``--kv-storage``, SPEC C-STORAGE; docs/metrics.md)."""

STORAGE_FIGURE = "storage.png"
"""Written besides ``OUTPUT_FILES`` when the run compares KV storage designs: hit rate and TTFT per design."""


OUTPUT_FILES = ("report.json", "config.json", "summary.csv", "lanes.png")
"""Files ``write_outputs`` puts into the output directory."""

REPORT_STATUSES = ("complete", "incomplete", "interrupted")
"""``report.json`` ``status``: every policy ran; some still to run (written after each policy); or the run
was interrupted (Ctrl-C) after the policies it holds (``policies_pending`` names the others)."""


class ReportWriteError(CpkvError):
    """An output file could not be written (``cpkv simulate`` exits 2 with this one line).

    Attributes: ``path`` (the file or directory), ``reason`` (the OS error text), ``result`` (the
    ``SimulationResult`` whose report it was, or None when the directory failed before the replay),
    ``note`` (what was written after all, appended to the message in parentheses).
    """

    def __init__(self, path: Path, reason: str, result: object = None, note: str = "") -> None:
        self.path, self.reason, self.result, self.note = Path(path), reason, result, note
        super().__init__(f"cannot write {path}: {reason}" + (f" ({note})" if note else ""))


@dataclass
class PolicyResult:
    """One policy's replay: ``metrics`` (JSON-ready dict with at least ``REPORT_FIELDS``), the lane
    timeline for the plot: ``times_ms`` float ``[steps]`` and ``used`` int ``[steps, C]`` pages, and
    ``ttft_ms`` float ``[finished requests]``, each finished request's TTFT in finishing order (``cpkv
    sweep`` pools them over the groups of a point; None where the run did not keep them)."""

    policy: str
    metrics: dict
    times_ms: np.ndarray = field(repr=False)
    used: np.ndarray = field(repr=False)
    ttft_ms: np.ndarray | None = field(default=None, repr=False)


def prepare_out_dir(out_dir: Path) -> None:
    """Create ``out_dir`` (with parents) and probe it: write a small file there and remove it.

    Run before the replay, so a directory that cannot take the report (no such parent, read-only file
    system, no space, ``/proc``) fails in a second, not after the simulation.

    Raises:
        ReportWriteError: naming ``out_dir`` and the OS error.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".cpkv-probe.", dir=out_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b"cpkv probe\n")
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.unlink(probe)
    except OSError as e:
        raise ReportWriteError(out_dir, e.strerror or str(e)) from None


def write_outputs(
    out_dir: Path,
    config: dict,
    results: list[PolicyResult],
    *,
    pending: Sequence[str] = (),
    interrupted: bool = False,
) -> list[Path]:
    """Write ``report.json``, ``config.json``, ``summary.csv`` and ``lanes.png`` into ``out_dir``, and
    ``storage.png`` when the results compare KV storage designs.

    ``report.json`` is ``{"status", "policies_pending", "config", "policies": {"<policy>": {metrics}}}``
    (``<design>/<policy>`` or ``<design>`` when designs are compared, see ``replay.runs``);
    ``status`` is ``complete`` when nothing is ``pending``, else ``incomplete`` (or ``interrupted``).
    Each file is written to a temporary name and renamed into place on its own; a file that fails does
    not stop the others.

    Returns:
        The paths written (four, or five with ``storage.png``).

    Raises:
        ReportWriteError: naming the first file that could not be written (the others were written).
    """
    status = "interrupted" if interrupted else "incomplete" if pending else "complete"
    report = {
        "status": status,
        "policies_pending": list(pending),
        "config": config,
        "policies": {r.policy: r.metrics for r in results},
    }
    payloads = {  # keys: OUTPUT_FILES; the plot is drawn only when it is written
        "report.json": lambda: json.dumps(report, indent=2).encode(),
        "config.json": lambda: json.dumps(config, indent=2).encode(),
        "summary.csv": lambda: _summary_csv(results).encode(),
        "lanes.png": lambda: _lanes_png(results, config, status),
    }
    if compares_designs(results):
        payloads[STORAGE_FIGURE] = lambda: _storage_png(results, config, status)
    failed: dict[str, str] = {}
    for name, payload in payloads.items():
        try:
            data = payload()
        except Exception as e:  # e.g. the plot: one file's content failing must not cost the others
            failed[name] = f"cannot produce it: {type(e).__name__}: {e}"
            continue
        try:
            write_atomic(out_dir / name, data)
        except OSError as e:
            failed[name] = e.strerror or str(e)
    if failed:
        name = next(iter(failed))
        written = [n for n in payloads if n not in failed]
        note = f"wrote {', '.join(written)}" if written else "no file was written"
        raise ReportWriteError(
            out_dir / name, failed[name], note=note + (f"; {len(failed) - 1} more failed" * (len(failed) > 1))
        )
    return [out_dir / name for name in payloads]


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically: a temporary file in the same directory, synced, then renamed.

    The file gets the mode a new file would (``0o666`` less the umask). Raises OSError; the temporary
    file never remains.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _summary_csv(results: list[PolicyResult]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    fields = _fields(results)
    writer.writerow(["policy", *fields])
    for r in results:
        row = [r.metrics.get(k) for k in fields]
        writer.writerow([r.policy, *(" ".join(map(str, v)) if isinstance(v, list) else v for v in row)])
    return buf.getvalue()


def compares_designs(results: list[PolicyResult]) -> bool:
    """Whether ``results`` hold a KV storage design other than owner-lane (``--kv-storage``)."""
    return any(r.metrics.get("kv_storage", "owner-lane") != "owner-lane" for r in results)


def _fields(results: list[PolicyResult]) -> tuple[str, ...]:
    """``REPORT_FIELDS``, plus ``SPEC_DECODE_FIELDS`` when a result has them and ``STORAGE_FIELDS`` when the
    results compare KV storage designs."""
    spec = any("draft_pages_allocated" in r.metrics for r in results)
    return (
        REPORT_FIELDS
        + (SPEC_DECODE_FIELDS if spec else ())
        + (STORAGE_FIELDS if compares_designs(results) else ())
    )


def _lanes_png(results: list[PolicyResult], config: dict, status: str) -> bytes:
    from .lanes_plot import lanes_png

    return lanes_png(results, config, status)


def _storage_png(results: list[PolicyResult], config: dict, status: str) -> bytes:
    from .storage_plot import storage_png

    return storage_png(results, config, status)


def load_plotting() -> None:
    """Import matplotlib now (about a second), before the replay: a Ctrl-C that lands inside a first
    import leaves matplotlib half-imported, and the report of the finished policies could not be drawn."""
    from .lanes_plot import load_matplotlib

    load_matplotlib()


LANES_PER_LINE = (8, 4, 2, 1)
"""``lane_pages_peak`` shows the most lanes per line of its table cell that let the table fit the console
(C=8 at 140 columns: the tiny-chunks figures 8 a line, the trace's 16,384s 4 a line)."""


def format_value(key: str, value: object, lanes_per_line: int = 4) -> str:
    """Text of one metric in the side-by-side table; one precision per metric, from its unit.

    Ratios (``*imbalance*``) 4 decimals, ms 1 decimal, seconds (``*_s``) 2 decimals, bytes (``*_bytes*``)
    in GB with 2 decimals, counts with thousands separators, lists of lane values ``lanes_per_line`` a line
    in equal-width columns, bools ``yes``/``no``, missing values ``-``. Examples ``format_value("sim_wall_s",
    14.9)`` -> ``"14.90"``, ``format_value("kv_comm_bytes", 1_234_000_000)`` -> ``"1.23 GB"``.
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if "_bytes" in key and isinstance(value, int):
        return f"{value / 1e9:,.2f} GB"
    if isinstance(value, list):
        cells = _lane_cells(value)
        return "\n".join(
            " ".join(cells[i : i + lanes_per_line]) for i in range(0, len(cells), lanes_per_line)
        )
    if isinstance(value, float):
        if "_ms" in key:
            return f"{value:,.1f}"
        if key.endswith("_s"):
            return f"{value:,.2f}"
        return f"{value:,.4f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _lane_cells(values: list) -> list[str]:
    width = max((len(f"{v:,}") for v in values), default=1)
    return [f"{v:,}".rjust(width) for v in values]


UNFINISHED = "unfinished"
"""The console's cell for a TTFT percentile that falls on a request that never got its first token (null in
``report.json``, empty in ``summary.csv``)."""


def _cell(key: str, metrics: dict, per_line: int) -> str:
    value = metrics.get(key)
    if value is None and key.startswith("ttft_ms_p") and metrics.get("requests_unfinished"):
        return UNFINISHED
    return format_value(key, value, per_line)


def print_table(results: list[PolicyResult], title: str, width: int | None = None) -> None:
    """Print the metrics of every policy side by side (rich table, one column per policy).

    ``width``: console columns (default: the terminal's, 140 when stdout is not a terminal). Metric
    names are never cut; ``lane_pages_peak`` takes the most lanes per line (``LANES_PER_LINE``) that fit.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width or (None if os.isatty(1) else 140))
    fields = _fields(results)
    name_width = max(map(len, fields))
    peaks = [r.metrics.get("lane_pages_peak") or [] for r in results]
    cp_size = max(map(len, peaks), default=0)
    room = (console.width - name_width - 4) // max(len(results), 1) - 3  # padding and separators
    cell = max((len(_lane_cells(p)[0]) for p in peaks if p), default=1) + 1
    per_line = next((k for k in LANES_PER_LINE if k * cell - 1 <= room), 1)
    per_line = min(per_line, max(cp_size, 1))
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("metric", no_wrap=True, min_width=name_width)
    for r in results:
        table.add_column(r.policy, justify="right", overflow="fold")
    for key in fields:
        name = key
        if key in ("lane_pages_peak", "draft_pages_per_lane") and cp_size > per_line:
            groups = [f"{i}-{min(i + per_line, cp_size) - 1}" for i in range(0, cp_size, per_line)]
            lanes = (
                f"lanes {' / '.join(groups[:2])}{' / ...' * (len(groups) > 2)}"
                if per_line > 1
                else "lane 0 first"
            )
            name += f"\n[dim]({lanes})[/dim]"
        table.add_row(name, *(_cell(key, r.metrics, per_line) for r in results))
    console.print(table)
