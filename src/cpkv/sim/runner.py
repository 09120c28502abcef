"""Run a workload under several owner policies and write the report (the ``cpkv simulate`` job)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import SimConfig
from .engine import PolicyRun
from .report import PolicyResult, print_table, write_outputs
from .workload import WorkloadSpec, workload_stats


@dataclass(frozen=True)
class SimulationResult:
    """All policies of one run: ``results`` in policy order, the ``config`` dict written to the report,
    and the output ``paths`` (empty when no ``out_dir`` was given)."""

    results: tuple[PolicyResult, ...]
    config: dict
    paths: tuple[Path, ...]


def simulate(
    config: SimConfig,
    workload: WorkloadSpec,
    policies: Sequence[str],
    *,
    out_dir: Path | None = None,
    progress: bool = True,
    table: bool = True,
) -> SimulationResult:
    """Replay ``workload`` once per policy with ``config``; optionally print and write the report.

    Args:
        config: the group and scheduler. workload: requests (and their description).
        policies: owner policies, e.g. ``["rotation", "legacy", "balanced"]``.
        out_dir: directory for ``report.json``, ``config.json``, ``summary.csv``, ``lanes.png``.
        progress: show a progress bar per policy (rich). table: print the side-by-side table.

    Returns:
        ``SimulationResult``. A livelock is a finding in the report, never an exception.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    report_config = {
        **config.to_dict(),
        "workload": workload.name,
        "workload_description": workload.description,
        "workload_stats": workload_stats(workload.requests),
        "policies": list(policies),
    }
    results = []
    total = len(workload.requests)
    with Progress(
        TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        disable=not progress, transient=False,
    ) as bar:  # fmt: skip
        for policy in policies:
            task = bar.add_task(policy, total=total)
            run = PolicyRun(config, policy, workload.requests)
            result = run.run(on_progress=lambda n, t=task: bar.update(t, completed=n))
            bar.update(task, completed=total if not result.metrics["livelock_detected"] else None)
            results.append(result)
    paths = tuple(write_outputs(out_dir, report_config, results)) if out_dir is not None else ()
    if table:
        print_table(results, f"cpkv simulate: {workload.description} | C={config.cp_size} P={config.page_size} "
                             f"Q={config.pages_per_lane}")  # fmt: skip
    return SimulationResult(tuple(results), report_config, paths)
