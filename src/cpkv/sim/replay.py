"""Run a workload under several owner policies, KV storage designs and CP strategies and write the report
(the ``cpkv simulate`` job).

Results are never lost: the output directory is probed before the first replay, the report is rewritten
after every policy (``status: incomplete`` until the last), a Ctrl-C writes the finished policies as
``status: interrupted``, and a write that still fails at the end comes after the table is printed.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from ..config import CP_STRATEGIES, ZIGZAG
from ..validate import expand_all
from .config import SimConfig
from .cost import coverage, step_cost
from .engine import PolicyRun
from .report import PolicyResult, ReportWriteError, load_plotting, prepare_out_dir, print_table, write_outputs
from .storage import OWNER_LANE
from .storage.traffic import KVTraffic
from .workload import WorkloadSpec, workload_stats


@dataclass(frozen=True)
class SimulationResult:
    """All replays of one run: ``results`` in run order (``runs``), the ``config`` dict written to the report,
    and the output ``paths`` (empty when no ``out_dir`` was given or nothing could be written)."""

    results: tuple[PolicyResult, ...]
    config: dict
    paths: tuple[Path, ...]


class SimulationInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``replay``: a ``KeyboardInterrupt`` that carries what was saved.

    Attributes: ``result`` (``SimulationResult`` of the finished policies; ``paths`` empty when none
    finished or the write failed), ``pending`` (policies not run), ``write_error`` (``ReportWriteError``
    or None).
    """

    def __init__(self, result: SimulationResult, pending: list[str], write_error: ReportWriteError | None):
        super().__init__(f"interrupted with {len(result.results)} policies finished")
        self.result, self.pending, self.write_error = result, pending, write_error


def replay(
    config: SimConfig,
    workload: WorkloadSpec,
    policies: Sequence[str],
    *,
    kv_storage: Sequence[str] = (OWNER_LANE,),
    cp_strategies: Sequence[str] | None = None,
    out_dir: Path | None = None,
    progress: bool = True,
    table: bool = True,
) -> SimulationResult:
    """Replay ``workload`` once per CP strategy, policy and KV storage design with ``config``; optionally print
    and write the report.

    Args:
        config: the group and scheduler. workload: requests (and their description).
        policies: owner policies, e.g. ``["rotation", "legacy", "balanced"]``.
        kv_storage: KV storage designs (``sim.storage.KV_STORAGE_DESIGNS``, SPEC C-STORAGE): ``owner-lane``
            runs once per policy, every other design once (its placement is its own). Results are named
            by ``runs``: the policy alone when only owner-lane runs (as without designs), else
            ``owner-lane/<policy>`` and the other designs' names.
        cp_strategies: CP strategies (``zigzag``, ``interleave``; C-INTERLEAVE), each a replay of every design
            and policy with ``config.cp_strategy`` replaced; None: ``config``'s alone. With more than one,
            each name above is prefixed ``<strategy>/``. Every result's metrics carry ``cp_strategy`` and
            the report's config ``cp_strategies`` (in place of the config's one ``cp_strategy``).
        out_dir: directory for ``report.json``, ``config.json``, ``summary.csv``, ``lanes.png``; created
            and probed before the first replay, rewritten after each policy.
        progress: show a progress bar per policy (rich). table: print the side-by-side table.

    Returns:
        ``SimulationResult``. A livelock is a finding in the report, never an exception.

    Raises:
        ConfigError: an unknown CP strategy (before any replay).
        CostExtraMissing, CostModelError: ``config.measured`` cannot be priced (before any replay).
        ReportWriteError: ``out_dir`` cannot be written (before any replay, ``result`` None), or an output
            file could not be written at the end (after the table was printed; ``result`` holds the run).
        SimulationInterrupted: Ctrl-C; the finished policies were written with ``status: interrupted``
            and their table printed.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    strategies = (
        expand_all(cp_strategies, CP_STRATEGIES, "cp_strategy")
        if cp_strategies is not None
        else [config.cp_strategy]
    )
    order = replays(policies, kv_storage, strategies)
    labels = [label for label, _, _, _ in order]
    shown = table or out_dir is not None  # a run for a reader (a sweep's point replays without either)
    if shown and config.measured is not None:
        from ..cost.coverage import check_covered

        check_covered(config.measured, config.cp_size)
    cost = step_cost(config)  # the measured tables are built once, before anything is written
    report_config = {
        **{k: v for k, v in config.to_dict().items() if k != "cp_strategy"},
        "cp_strategies": strategies,
        "cost_provenance": {**cost.provenance(), **(coverage(config, workload.requests) if shown else {})},
        **({"memory": memory_report(config)} if shown and config.measured is not None else {}),
        "workload": workload.name,
        "workload_description": workload.description,
        "workload_stats": workload_stats(workload.requests),
        **({"workload_window": workload.window} if workload.window else {}),
        "policies": list(policies),
        **(
            {"kv_storage": list(kv_storage), "kv_traffic": KVTraffic(cost, config.cp_size).provenance()}
            if list(kv_storage) != [OWNER_LANE]
            else {}
        ),
        **({"runs": labels} if labels != list(policies) else {}),
    }
    if out_dir is not None:
        prepare_out_dir(out_dir)
        load_plotting()
    results: list[PolicyResult] = []
    total = len(workload.requests)
    title = (
        f"cpkv simulate: {workload.description} | C={config.cp_size} P={config.page_size} "
        f"Q={config.pages_per_lane}{strategy_line(strategies)} | {cost_line(report_config['cost_provenance'])}"
    )
    try:
        with Progress(
            TextColumn("{task.description:>9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not progress,
            transient=False,
        ) as bar:
            for label, strategy, design, policy in order:
                task = bar.add_task(label, total=total)
                result = PolicyRun(
                    replace(config, cp_strategy=strategy), policy, workload.requests, cost, kv_storage=design
                ).run(on_progress=partial(_completed, bar, task))
                gc.collect()  # the replay's state (its cache's tree is reference cycles) freed before the report
                result = replace(result, policy=label, metrics={**result.metrics, "cp_strategy": strategy})
                bar.update(task, completed=total if not result.metrics["livelock_detected"] else None)
                results.append(result)
                if out_dir is not None and len(results) < len(labels):
                    _write(out_dir, report_config, results, labels)  # a later Ctrl-C or kill keeps it
    except KeyboardInterrupt:
        pending = labels[len(results) :]
        paths, error = (), None
        if results and out_dir is not None:
            paths, error = _write(out_dir, report_config, results, labels, interrupted=True)
        if table and results:
            print_table(results, f"{title} | interrupted: {', '.join(pending)} not run")
        raise SimulationInterrupted(
            SimulationResult(tuple(results), report_config, paths), pending, error
        ) from None
    paths, error = _write(out_dir, report_config, results, labels) if out_dir is not None else ((), None)
    if table:
        print_table(results, title)
        print(f"error band of the times above: {report_config['cost_provenance'].get('error_band')}")
    outcome = SimulationResult(tuple(results), report_config, paths)
    if error is not None:
        note = f"{error.note}; the table above has the results" if table else error.note
        raise ReportWriteError(error.path, error.reason, outcome, note)
    return outcome


def runs(policies: Sequence[str], kv_storage: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(label, design, policy)`` of each replay, in order: ``owner-lane`` under each policy, every other
    design once (under the first policy, which it does not read). The label is the policy alone when only
    owner-lane runs, else ``owner-lane/<policy>`` and the design's name. Example policies [rotation,
    balanced], designs [owner-lane, replicated]: owner-lane/rotation, owner-lane/balanced, replicated."""
    alone = list(kv_storage) == [OWNER_LANE]
    out = []
    for design in kv_storage:
        if design != OWNER_LANE:
            out.append((design, design, policies[0]))
            continue
        out += [(p if alone else f"{OWNER_LANE}/{p}", OWNER_LANE, p) for p in policies]
    return out


def replays(
    policies: Sequence[str], kv_storage: Sequence[str], cp_strategies: Sequence[str]
) -> list[tuple[str, str, str, str]]:
    """``(label, cp_strategy, design, policy)`` of each replay, in order: ``runs(policies, kv_storage)`` under
    each strategy in turn, the label prefixed ``<strategy>/`` when there is more than one. Example
    strategies [zigzag, interleave], policies [balanced], designs [owner-lane]: zigzag/balanced,
    interleave/balanced."""
    prefix = len(cp_strategies) > 1
    return [
        (f"{s}/{label}" if prefix else label, s, design, policy)
        for s in cp_strategies
        for label, design, policy in runs(policies, kv_storage)
    ]


def strategy_line(cp_strategies: Sequence[str]) -> str:
    """The CP strategies for the table's title: empty for ``zigzag`` alone (the default, as before the
    strategies), else e.g. `` CP zigzag, interleave``."""
    return "" if list(cp_strategies) == [ZIGZAG] else f" CP {', '.join(cp_strategies)}"


def _completed(bar: Any, task: Any, n: int) -> None:
    """The progress bar's ``task`` at ``n`` requests done."""
    bar.update(task, completed=n)


def memory_report(config: SimConfig) -> dict:
    """``report.json``'s ``config.memory``: one GPU's memory under the measured model (``SimConfig.memory``),
    ``pages_per_lane`` the pool the GPU holds, and ``pages_per_lane_used`` with ``fits`` for the run's own."""
    memory = config.memory()
    assert memory is not None  # the report holds it under the measured cost model only
    plan = dict(memory)
    used = max(config.lane_capacities)
    return {**plan, "pages_per_lane_used": used, "fits": used <= plan["pages_per_lane"]}


def cost_line(provenance: dict) -> str:
    """What priced the run, for the table's title: e.g. ``times: measured h200_sxm deepseek-ai/DeepSeek-V3.2
    sglang 0.5.14 (aiconfigurator 0.12.0, EP 8)`` or ``times: illustrative constants (not a GPU's)``."""
    if provenance.get("cost_model") != "measured":
        return "times: illustrative constants (not a GPU's)"
    p = provenance
    return (
        f"times: measured {p['gpu']} {p['model']} {p['backend']} {p['backend_version']} "
        f"(aiconfigurator {p['aiconfigurator_version']}, EP {p['ep_size']})"
        + (" | EXTRAPOLATED" if p.get("extrapolated") else "")
    )


def _write(out_dir, report_config, results, policies, *, interrupted=False):
    """``(paths, None)`` after writing the report of ``results``, or ``((), ReportWriteError)``."""
    try:
        pending = policies[len(results) :]
        return tuple(
            write_outputs(out_dir, report_config, results, pending=pending, interrupted=interrupted)
        ), None
    except ReportWriteError as e:
        return (), e
