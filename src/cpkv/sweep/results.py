"""A sweep's results: one row per point (its resolved settings and every report metric), written as
``results.csv`` / ``results.json``; the designs table (the fewest GPUs that meet the target, per design)
as ``summary.csv`` and on the console; the Pareto front of GPUs against TTFT p99.

Rows hold nothing that times the machine (``columns.TIMING_FIELDS``), so the files are identical
whichever executor ran the points.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import cast

from ..sim.report import SPEC_DECODE_FIELDS, format_value
from .columns import METRIC_FIELDS, TIMING_FIELDS

HEAD_COLUMNS = ("point", "status", "error")
SUMMARY_SHOWN = 15
"""Rows of the designs table printed on the console (``summary.csv`` has them all)."""


def meets(row: dict, target) -> bool:
    """Whether a point meets ``target`` (a ``grid.Target`` or None): it ran, served every request (none
    rejected, no livelock) and meets every condition."""
    if (
        row.get("status") != "ok"
        or row.get("livelock_detected")
        or row.get("requests_finished") != row.get("requests_total")
    ):
        return False
    return target is None or target.holds(row)


def metric_fields(rows: Sequence[dict]) -> tuple[str, ...]:
    """``METRIC_FIELDS``, then ``SPEC_DECODE_FIELDS`` when a row has them."""
    spec = any(r.get("draft_pages_allocated") is not None for r in rows)
    return METRIC_FIELDS + (SPEC_DECODE_FIELDS if spec else ())


def results_csv(rows: Sequence[dict], config_columns: Sequence[str]) -> str:
    """``results.csv``: ``point, status, error``, the config columns, every metric, ``extrapolated`` (what
    the point prices past the measured tables, ``cost_provenance.extrapolated`` joined by ``; ``; empty when
    nothing), ``key``; lists (lanes) as space-separated numbers, per-lane ``pages_per_lane`` as
    ``9,10,10,10``, None empty."""
    fields = (*HEAD_COLUMNS, *config_columns, *metric_fields(rows), "extrapolated", "key")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        extra = {"extrapolated": (row.get("_provenance") or {}).get("extrapolated")}
        writer.writerow([_cell(k, extra[k] if k in extra else row.get(k)) for k in fields])
    return buf.getvalue()


def _cell(key: str, value: object) -> object:
    if key == "extrapolated":
        return "; ".join(cast("Iterable[str]", value or ()))
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) if key == "pages_per_lane" else " ".join(map(str, value))
    return value


def results_json(rows: Sequence[dict], records: Sequence[dict | None], header: dict) -> str:
    """``results.json``: ``header`` (status, grid, workload, target) and ``points``: each row's ``point``,
    ``key``, ``status``, ``error``, ``settings`` (the grid's values as written), ``config`` (the resolved
    settings), ``sim_config`` (the whole ``SimConfig``), ``cost_provenance``, ``metrics`` (the whole
    combined report, timing left out) and ``per_group``."""
    points = []
    for row, record in zip(rows, records, strict=True):
        metrics = None
        if record is not None and record.get("metrics") is not None:
            metrics = {k: v for k, v in record["metrics"].items() if k not in TIMING_FIELDS}
        points.append(
            {
                "point": row["point"],
                "key": row.get("key"),
                "status": row["status"],
                "error": row["error"],
                "settings": row["_settings"],
                "config": row["_config"],
                "sim_config": row["_sim_config"],
                "cost_provenance": row["_provenance"],
                "metrics": metrics,
                "per_group": record.get("per_group") if record else None,
            }
        )
    return json.dumps({**header, "points": points}, indent=1, default=str) + "\n"


def design_of(row: dict, varied: Sequence[str]) -> tuple:
    """The design of a point: its values of the varied grid keys other than ``groups``; ``policy`` None where
    the replay has no owner policy (a KV storage design other than owner-lane places pages its own way, so
    its points under two policies are one design, one row of the table)."""
    return tuple(
        (k, None if k == "policy" and row.get("policy") is None else row["_settings"][k])
        for k in varied
        if k != "groups"
    )


def designs(rows: Sequence[dict], varied: Sequence[str], target) -> list[dict]:
    """The designs table: per design, the point with the fewest GPUs that meets ``target`` (ties: lower
    TTFT p99), or, where none does, its point with the lowest TTFT p99 (``fits`` False). Fitting designs
    first, by GPUs then TTFT p99; the others by TTFT p99."""
    by: dict[tuple, list[dict]] = {}
    for row in rows:
        by.setdefault(design_of(row, varied), []).append(row)
    out = []
    for design, members in by.items():
        ran = [r for r in members if r["status"] == "ok"]
        fit = sorted((r for r in ran if meets(r, target)), key=lambda r: (r["gpus"], _p99(r)))
        best = fit[0] if fit else min(ran, key=_p99, default=None)
        out.append({**dict(design), "fits": bool(fit), "row": best, "failed": len(members) - len(ran)})
    inf = float("inf")
    out.sort(
        key=lambda d: (
            not d["fits"],
            d["row"]["gpus"] if d["fits"] else inf,
            _p99(d["row"]) if d["row"] else inf,
        )
    )
    return out


def _p99(row: dict) -> float:
    """A row's TTFT p99 for ordering: infinite where it falls on an unfinished request (None)."""
    p99 = row.get("ttft_ms_p99")
    return float("inf") if p99 is None else p99


SUMMARY_METRICS = (
    "groups",
    "gpus",
    "requests_finished",
    "requests_total",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "cache_hit_rate",
    "compute_imbalance",
)
"""The chosen point's columns in the designs table (the console joins the two request counts as ``served``)."""


def summary_csv(table: list[dict], varied: Sequence[str]) -> str:
    """``summary.csv``: the designs table, one row per design (its keys, ``fits``, ``SUMMARY_METRICS`` of
    the chosen point, ``point``)."""
    keys = [k for k in varied if k != "groups"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*keys, "fits", *SUMMARY_METRICS, "point"])
    for d in table:
        row = d["row"] or {}
        writer.writerow(
            [_cell(k, d[k]) for k in keys]
            + [d["fits"]]
            + [_cell(m, row.get(m)) for m in SUMMARY_METRICS]
            + [row.get("point", "")]
        )
    return buf.getvalue()


def pareto_front(rows: Sequence[dict]) -> list[dict]:
    """The points no other beats on both GPUs and TTFT p99 (among those that served every request), by
    GPUs: each has a lower TTFT p99 than every point with as few GPUs or fewer."""
    ok = sorted((r for r in rows if meets(r, None)), key=lambda r: (r["gpus"], r["ttft_ms_p99"]))
    front, best = [], float("inf")
    for r in ok:
        if r["ttft_ms_p99"] < best:
            front.append(r)
            best = r["ttft_ms_p99"]
    return front


def print_summary(
    table: list[dict], varied: Sequence[str], title: str, target, width: int | None = None
) -> None:
    """Print the designs table (rich): at most ``SUMMARY_SHOWN`` rows, best first."""
    import os

    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width or (None if os.isatty(1) else 140))
    keys = [k for k in varied if k != "groups"]
    out = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for k in keys:
        out.add_column(k, no_wrap=True)
    out.add_column("fits" if target is not None else "serves all", justify="center")
    shown = [
        m for m in SUMMARY_METRICS if m not in ("requests_finished", "requests_total", "compute_imbalance")
    ]
    for m in ("served", *shown):
        out.add_column(m, justify="right")
    for d in table[:SUMMARY_SHOWN]:
        row = d["row"] or {}
        served = f"{row['requests_finished']:,}/{row['requests_total']:,}" if row else "-"
        cells = ["-" if d[k] is None else str(d[k]) for k in keys] + ["yes" if d["fits"] else "no", served]
        out.add_row(*cells, *(format_value(m, row.get(m)) for m in shown))
    console.print(out)
    if len(table) > SUMMARY_SHOWN:
        console.print(f"... {len(table) - SUMMARY_SHOWN} more designs in summary.csv")
