"""Run a sweep (the ``cpkv sweep`` job): plan the points, skip those whose result is stored, replay the
rest on an executor with a progress bar, store each result as it arrives, then write the results, the
designs table and the figures.

Files under ``--out DIR`` (each replaced atomically: a reader never sees half of one):
``points/<key>.json`` (one per replayed point, written as it arrives: what a re-run or a run after Ctrl-C
finds and skips), ``results.csv``, ``results.json``, ``summary.csv``, ``pareto.png``, ``hit_rate.png``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..sim.report import ReportWriteError, prepare_out_dir, write_atomic
from .columns import METRIC_FIELDS, TIMING_FIELDS
from .executors import run_local, run_ray
from .grid import Grid
from .point import CPKV_VERSION, Shipment
from .points import SweepPoints, prepare_points
from .results import designs, metric_fields, print_summary, results_csv, results_json, summary_csv
from .search import search_groups, search_lines

OUTPUT_FILES = ("results.csv", "results.json", "summary.csv", "pareto.png", "hit_rate.png")
POINTS_DIR = "points"


class SweepTerminated(KeyboardInterrupt):
    """SIGTERM, turned into this interrupt by ``cpkv sweep`` (its handler raises it): a sweep stops as on
    Ctrl-C, and the command exits 143 (128 + SIGTERM) instead of 130."""


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM: ``terminated``) during a sweep, after the finished points' results were
    written: ``line`` says what."""

    def __init__(self, line: str, terminated: bool = False) -> None:
        super().__init__(line)
        self.line, self.terminated = line, terminated


@dataclass(frozen=True)
class SweepOutcome:
    """``rows`` (one per point, grid order), ``replayed`` (points replayed by this run), ``stored``
    (found under ``points/``), ``failed``, ``paths`` (files written), ``wall_s``."""

    rows: list[dict]
    replayed: int
    stored: int
    failed: int
    paths: tuple[Path, ...]
    wall_s: float


def sweep(
    grid: Grid,
    out_dir: Path,
    *,
    executor: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    retry_failed: bool = False,
    table: bool = True,
) -> SweepOutcome:
    """Sweep ``grid`` into ``out_dir`` (see the module docstring).

    Args:
        executor: ``local`` (process pool) or ``ray``. workers: processes / actors (default: every core,
            or the Ray cluster's CPUs). ray_address: an existing Ray cluster (None: a local Ray).
        retry_failed: replay points whose stored result failed (default: a failure is a result).
        progress: show the progress bar. table: print the designs table.

    Raises:
        ReportWriteError: ``out_dir`` cannot be written (before any replay).
        GridError, CpkvError: see ``prepare_points``.
        SweepInterrupted: Ctrl-C or ``SweepTerminated`` (SIGTERM; ``.terminated``); the finished points are
            stored and the results of those written.
    """
    from ..sim.report import load_plotting

    t0 = time.perf_counter()
    plan = (
        prepare_points(grid) if grid.search is None else None
    )  # a bad point fails before anything is written
    prepare_out_dir(out_dir)
    points_dir = out_dir / POINTS_DIR
    prepare_out_dir(points_dir)
    load_plotting()  # before any replay: a Ctrl-C inside a first import would leave it half-imported
    replay = Replayer(points_dir, executor, workers, ray_address, progress, retry_failed)
    found, terminated = None, False
    try:
        if plan is None:
            plan, found = search_groups(grid, replay)
        else:
            replay(plan)
    except KeyboardInterrupt as e:
        replay.status, terminated = "interrupted", isinstance(e, SweepTerminated)
        plan = plan or replay.merged(grid)
    rows = _fill(plan, replay.records, replay.lost)
    paths = _write(
        out_dir, grid, plan, rows, [replay.records.get(r["key"]) for r in rows], replay.status, found
    )
    outcome = SweepOutcome(
        rows, replay.replayed, replay.stored, replay.failed, paths, time.perf_counter() - t0
    )
    if replay.status == "interrupted":
        finished = sum(1 for r in rows if r["status"] in ("ok", "failed"))
        raise SweepInterrupted(
            f"interrupted after {finished} of {len(rows)} points; wrote {out_dir}/results.csv "
            "(finished points only): run the same command again to replay the rest",
            terminated,
        )
    if table:
        print_summary(designs(rows, grid.varied, grid.target), grid.varied, _title(grid, plan), grid.target)
        for line in search_lines(found or []):
            print(line)
        print(f"error band of the times above: {error_band(plan)}")
    return outcome


class Replayer:
    """Replays plans into ``points_dir`` (a sweep calls it once; a search once a round), keeping every
    point's record: ``records`` and ``lost`` by key, the counts ``replayed``, ``stored`` (found under
    ``points/``), ``failed``, ``status`` (``complete`` or ``interrupted``) and the ``plans`` replayed."""

    def __init__(
        self, points_dir: Path, executor: str, workers, ray_address, progress: bool, retry_failed: bool
    ):
        self.points_dir, self.executor, self.workers, self.ray_address = (
            points_dir,
            executor,
            workers,
            ray_address,
        )
        self.progress, self.retry_failed = progress, retry_failed
        self.records: dict[str, dict] = {}
        self.lost: dict[str, dict] = {}
        self.replayed = self.stored = self.failed = 0
        self.status = "complete"
        self.plans: list[SweepPoints] = []

    def merged(self, grid: Grid) -> SweepPoints:
        """One plan of every point replayed so far, renumbered in order (a search's rounds)."""
        out = SweepPoints([], {}, {}, self.plans[0].config_columns if self.plans else [])
        seen: set = set()
        for plan in self.plans:
            for row in plan.rows:
                ident = (row["key"], tuple(sorted(row["_settings"].items(), key=str)))
                if ident in seen:
                    continue
                seen.add(ident)
                out.rows.append({**row, "point": len(out.rows) + 1})
            out.tasks.update(plan.tasks)
            out.workloads.update(plan.workloads)
            out.price_tables.update(plan.price_tables)
            out.provenances += [p for p in plan.provenances if p not in out.provenances]
        return out

    def __call__(self, plan: SweepPoints) -> None:
        """Replay the points of ``plan`` not stored yet; KeyboardInterrupt after storing the finished ones."""
        from rich import progress as rp

        self.plans.append(plan)
        records, points_dir = self.records, self.points_dir
        fresh = [k for k in plan.tasks if k not in records]
        for key in fresh:
            record = _load(points_dir / f"{key}.json", key)
            if record is not None and (record["status"] == "ok" or not self.retry_failed):
                records[key] = record
                self.stored += 1
        todo = [t for k, t in plan.tasks.items() if k not in records]
        # Longest first, so the workers finish together: a point of more groups replays more steps (each group's
        # replay its own). Stable: grid order otherwise. The results do not depend on the order.
        todo.sort(key=lambda t: -t.groups)
        columns = (
            rp.TextColumn("{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TextColumn("[red]{task.fields[failed]} failed"),
            rp.TextColumn("ETA"),
            rp.TimeRemainingColumn(),
            rp.TextColumn("elapsed"),
            rp.TimeElapsedColumn(),
        )
        done = [r for r in plan.rows if r["status"] == "failed" or r["key"] in records]
        failed = sum(1 for r in done if r["status"] == "failed" or records[r["key"]]["status"] != "ok")
        per_key: dict[str, int] = {}  # rows per key (points of one config replay once)
        first_row: dict[str, dict] = {}
        for r in plan.rows:
            if r["key"] is not None:
                per_key[r["key"]] = per_key.get(r["key"], 0) + 1
                first_row.setdefault(r["key"], r)
        with rp.Progress(*columns, disable=not self.progress, transient=False) as bar:
            job = bar.add_task(
                f"cpkv sweep ({self.executor})", total=len(plan.rows), completed=len(done), failed=failed
            )

            def on_result(task, result) -> None:
                nonlocal failed
                if result["status"] == "ok" and result["cpkv_version"] != CPKV_VERSION:
                    result = {
                        **result,
                        "status": "lost",
                        "error": f"the worker runs cpkv {result['cpkv_version']}, this driver {CPKV_VERSION}",
                    }
                if result["status"] == "lost":
                    self.lost[task.key] = result
                else:
                    record = _record(task, result, first_row[task.key])
                    path = points_dir / f"{task.key}.json"
                    try:
                        write_atomic(path, json.dumps(record, indent=1, default=str).encode())
                    except OSError as e:  # the points stored so far stay; the executor stops the workers
                        raise ReportWriteError(path, e.strerror or str(e)) from None
                    records[task.key] = record
                    self.replayed += 1
                failed += per_key[task.key] * (result["status"] != "ok")
                bar.update(job, advance=per_key[task.key], failed=failed)

            try:
                if self.executor == "ray":
                    run_ray(todo, _needed(plan, todo), self.workers, self.ray_address, on_result)
                else:
                    run_local(todo, _needed(plan, todo), self.workers, on_result)
            finally:
                self.failed += failed


def error_band(plan: SweepPoints) -> str:
    """The published error band of the tables that priced ``plan`` (``cost.coverage``): the measured one
    when any point is measured, else the illustrative model's "no error band"."""
    from ..cost.coverage import ERROR_BAND, ILLUSTRATIVE_BAND

    return (
        ERROR_BAND if any(p.get("cost_model") == "measured" for p in plan.provenances) else ILLUSTRATIVE_BAND
    )


def _needed(plan: SweepPoints, todo: list) -> Shipment:
    """What every worker receives once: the workloads the tasks to run read and the plan's price tables."""
    return Shipment(
        {d: plan.workloads[d] for d in dict.fromkeys(t.workload for t in todo)}, plan.price_tables
    )


def _load(path: Path, key: str) -> dict | None:
    """A stored point's record, or None (then the point is replayed): no file, not JSON, or not a complete
    record of ``key`` as ``_record`` writes it (``ok``: ``metrics`` a table of every metric column and
    no error; ``failed``: a one-line error and no metrics; ``per_group`` a list of tables or null)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or record.get("cpkv_version") != CPKV_VERSION:
        return None
    status, error, metrics, groups = (record.get(k) for k in ("status", "error", "metrics", "per_group"))
    if groups is not None and not (isinstance(groups, list) and all(isinstance(g, dict) for g in groups)):
        return None
    if status == "ok":
        ok = error is None and isinstance(metrics, dict) and all(f in metrics for f in METRIC_FIELDS)
    else:
        ok = status == "failed" and isinstance(error, str) and metrics is None
    return record if ok else None


def _record(task, result: dict, row: dict) -> dict:
    """What ``points/<key>.json`` holds: the point's whole config, its cost provenance and its result."""
    return {
        "key": task.key,
        "cpkv_version": CPKV_VERSION,
        "workload_digest": task.workload,
        "policy": task.policy,
        "groups": task.groups,
        "routing": task.routing,
        "sim_config": row["_sim_config"],
        "cost_provenance": row["_provenance"],
        **result,
    }


def _fill(plan: SweepPoints, records: dict, lost: dict) -> list[dict]:
    """The rows with each point's status, error and metrics (timing left out)."""
    rows = []
    for row in plan.rows:
        row = dict(row)
        record = records.get(row["key"]) or lost.get(row["key"])
        if row["status"] is None and record is not None:
            row["status"], row["error"] = record["status"], record["error"]
            row.update({k: v for k, v in (record.get("metrics") or {}).items() if k not in TIMING_FIELDS})
        elif row["status"] is None:
            row["status"] = "not run"
        rows.append(row)
    return rows


def _title(grid: Grid, plan: SweepPoints) -> str:
    """E.g. ``cpkv sweep g.toml: Mooncake trace t.jsonl, 2,000 requests, 48 points | times: measured ...``."""
    from ..sim.replay import cost_line

    several = len(plan.provenances) > 1  # e.g. one per cp_size: their EP widths differ
    lines = {
        cost_line(
            {**p, "ep_size": "= cp_size" if p.get("ep_size") == p.get("cp_size") else "per point"}
            if several
            else p
        )
        for p in plan.provenances
    }
    cost = lines.pop() if len(lines) == 1 else "times: several cost models"
    trace = grid.workload["trace"]
    workloads = "; ".join(
        f"{s.description.replace(str(trace), trace.name) if trace else s.description}, {len(s.requests):,} requests"
        for s in plan.workloads.values()
    )
    return f"cpkv sweep {grid.path.name}: {workloads}, {len(plan.rows)} points | {cost}"


def _write(
    out_dir: Path,
    grid: Grid,
    plan: SweepPoints,
    rows: list[dict],
    records: list,
    status: str,
    found: list[dict] | None = None,
) -> tuple:
    from ..sim.workload import workload_stats
    from .plots import hit_rate_png, pareto_png

    title = _title(grid, plan)
    header = {
        "status": status,
        "cpkv_version": CPKV_VERSION,
        "grid": grid.text,
        "varied": grid.varied,
        "target": grid.target.text if grid.target else None,
        "workloads": {
            d: {"description": s.description, "stats": workload_stats(s.requests), "window": s.window}
            for d, s in plan.workloads.items()
        },
        "metric_fields": list(metric_fields(rows)),
        **({"search": found} if found is not None else {}),
    }
    payloads = {
        "results.csv": lambda: results_csv(rows, plan.config_columns).encode(),
        "results.json": lambda: results_json(rows, records, header).encode(),
        "summary.csv": lambda: summary_csv(designs(rows, grid.varied, grid.target), grid.varied).encode(),
        "pareto.png": lambda: pareto_png(rows, grid.varied, grid.target, title),
        "hit_rate.png": lambda: hit_rate_png(rows, grid.varied, title),
    }
    for name, payload in payloads.items():
        try:
            write_atomic(out_dir / name, payload())
        except OSError as e:
            raise ReportWriteError(out_dir / name, e.strerror or str(e)) from None
    return tuple(out_dir / name for name in payloads)
