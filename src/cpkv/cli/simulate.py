"""``cpkv simulate``: replay traffic through one CP prefill group under each owner policy, KV storage design and
CP strategy (``cpkv.sim``). Its options are ``sim.settings.SETTINGS`` (one click option each,
``setting_option``) and the report's two (``REPORT_OPTIONS``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ..config import CP_STRATEGIES, DEFAULT_PAGE_SIZE, OWNER_POLICIES
from ..errors import InputError
from ..sim.config import KV_STORAGE_DESIGNS, SimConfig
from ..sim.settings import (
    COST_OPTIONS,
    SETTINGS,
    STORAGE_OPTION,
    STRATEGY_OPTION,
    Setting,
    check_workload_options,
    config_of,
    measured_spec,
    workload_of,
)
from ..validate import expand_all
from .options import FilePath, parse_callback

REPORT_OPTIONS = ("out_dir", "no_progress")
"""``simulate`` options that say where and how to report, not what to simulate (not in ``SETTINGS``)."""


def setting_option(setting: Setting):
    """The click option (a decorator) of one ``sim.settings.Setting``: its flag, type (``choices`` a
    ``click.Choice``, ``Path`` a ``FilePath``, ``bool`` a flag), default, help and ``parse`` (a callback)."""
    kind = (
        click.Choice(setting.choices)
        if setting.choices is not None
        else FilePath()
        if setting.kind is Path
        else setting.kind
    )
    if setting.kind is bool:
        return click.option(
            setting.flag, setting.name, is_flag=True, default=setting.default, help=setting.help
        )
    shown: dict[str, Any] = {"show_default": True} if setting.show_default else {}
    return click.option(
        setting.flag,
        setting.name,
        type=kind,
        default=setting.default,
        multiple=setting.multiple,
        help=setting.help,
        callback=parse_callback(setting.parse) if setting.parse is not None else None,
        **shown,
    )


def with_settings(f):
    """``f`` with every setting's click option, in ``SETTINGS`` order."""
    for setting in reversed(SETTINGS):
        f = setting_option(setting)(f)
    return f


@click.command()
@with_settings
@click.option(
    "--out",
    "out_dir",
    type=FilePath(),
    default=Path("out/simulate"),
    show_default=True,
    help="Directory for report.json, summary.csv, lanes.png.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def simulate(**options) -> None:
    """Replay traffic through one CP prefill group under each owner policy, KV storage design and CP strategy;
    write a side-by-side report.

    The output directory is created and probed before the replay, the report is rewritten after each
    policy (report.json "status": "incomplete" until the last) and every file is replaced atomically.
    Ctrl-C writes the finished policies ("status": "interrupted") and exits 130; a file that still cannot
    be written at the end is named on one line after the table (exit 2).

    Times are H200 milliseconds of DeepSeek-V3.2 on SGLang by default (--cost-model measured, the `cost`
    extra: pip install '.[cost]' in a cpkv checkout); docs/cost-model.md says what they hold.
    """
    from ..sim.replay import SimulationInterrupted, replay
    from ..sim.report import prepare_out_dir

    out_dir, no_progress = options.pop("out_dir"), options.pop("no_progress")
    check_workload_options(options)
    check_out_dir(out_dir)
    measured = measured_spec(
        *(options[k] for k in COST_OPTIONS)
    )  # a flag refused fails before the trace is read
    if measured is not None:
        from ..cost.coverage import check_covered

        check_covered(
            measured, options["cp_size"]
        )  # a GPU / engine / model without data: one line naming what has
    spec = workload_of(options)
    config = config_of(options, spec)
    for warning in (
        extrapolation_warning(config, spec.requests),
        pool_warning(config, options["pages_per_lane"]),
    ):
        if warning:
            click.echo(f"cpkv: warning: {warning}", err=True)
    hint = small_page_hint(config.page_size, min(config.lane_capacities))
    if hint:
        click.echo(f"cpkv: note: {hint}", err=True)
    policies = expand_all(options["policies"], OWNER_POLICIES, "policy")
    designs = expand_all(options[STORAGE_OPTION], KV_STORAGE_DESIGNS, "kv storage")
    strategies = expand_all(options[STRATEGY_OPTION], CP_STRATEGIES, "cp_strategy")
    lines = load_summary(config, spec.requests)
    prepare_out_dir(out_dir)  # as the replay does first: an output that fails prints nothing before its error
    click.echo("\n".join(lines))
    try:
        result = replay(
            config,
            spec,
            policies,
            kv_storage=designs,
            cp_strategies=strategies,
            out_dir=out_dir,
            progress=not no_progress,
        )
    except SimulationInterrupted as e:
        raise click.exceptions.Abort(interrupted_line(e, out_dir)) from None  # main prints it on one line
    for r in result.results:
        if r.metrics.get("livelock"):
            click.echo(livelock_line(r.policy, r.metrics["livelock"]))
    click.echo(f"wrote {', '.join(str(p) for p in result.paths)}")


def load_summary(config: SimConfig, requests) -> list[str]:
    """The lines ``simulate`` prints before its replay: the offered prefill load of ``requests`` against one
    group's capacity under the run's cost model and what it means for TTFT (``sim.load``)."""
    from ..sim.cost import step_cost
    from ..sim.load import load_lines, offered_load

    cost = step_cost(config)  # the measured tables are kept for the replay (cost.aic.price_tables)
    priced_by = "illustrative constants" if config.measured is None else f"measured {config.measured.gpu}"
    return load_lines(offered_load(config, requests, cost), config, priced_by)


def livelock_line(label: str, finding: dict) -> str:
    """One line after the table for a replay that stopped in a livelock (``finding``: its report.json
    ``livelock``): the lane that ran out, the free pages of the others, the requests waiting on it."""
    free, lane = finding["free_pages_per_lane"], finding["lane"]
    others = [f for i, f in enumerate(free) if i != lane] or [0]
    rest = f"{min(others):,}" if min(others) == max(others) else f"{min(others):,} to {max(others):,}"
    named = len(free) > 1 and 0 <= lane < len(free)  # lane -1: no lane was short
    where = (
        f"lane {lane} has {free[lane]:,} free pages, the other lanes {rest} each"
        if named
        else f"free pages per lane {min(free):,} to {max(free):,}"
    )
    return (
        f"{label}: livelock after {finding['stalled_steps']:,} steps without progress: {where}; "
        f"{finding['blocked_count']:,} admitted requests wait (report.json: policies.{label}.livelock)"
    )


def pool_warning(config: SimConfig, given) -> str | None:
    """One line when an explicit ``--pages-per-lane`` (``given``) is larger than what one GPU holds under the
    measured model (``SimConfig.memory``), naming both sizes, or when the model leaves no pool at all; else
    None. The run goes on: the pool is then hypothetical."""
    memory, measured = config.memory(), config.measured
    P = config.page_size
    if memory is None or measured is None:  # the illustrative model (memory() is None without measured)
        return None
    if memory["pages_per_lane"] < 2:
        over = -memory["headroom_bytes"] / 1e9
        return (
            f"{measured.model} does not fit {config.cp_size} x {measured.gpu} at EP "
            f"{measured.ep_for(config.cp_size)}: weights and activations leave no KV pool ({over:,.1f} GB "
            f"short, report.json: config.memory); the pool of {max(config.lane_capacities):,} pages is hypothetical"
        )
    if given is None or max(config.lane_capacities) <= memory["pages_per_lane"]:
        return None
    return (
        f"--pages-per-lane {max(config.lane_capacities):,} ({max(config.lane_capacities) * P:,} tokens a GPU) is "
        f"larger than the {memory['pages_per_lane']:,} pages ({memory['kv_pool_tokens']:,} tokens) of KV one "
        f"{measured.gpu} holds beside the weights (report.json: config.memory); the pool is hypothetical"
    )


def extrapolation_warning(config: SimConfig, requests) -> str | None:
    """One line naming what ``config`` replaying ``requests`` prices past aiconfigurator's installed
    measurements (``sim.cost.coverage``; report.json records it in ``cost_provenance.extrapolated``), or None."""
    from ..sim.cost import coverage

    parts = coverage(config, requests)["extrapolated"]
    if not parts:
        return None
    return (
        f"priced outside the measured tables: {'; '.join(parts)} (report.json: cost_provenance.extrapolated)"
    )


SLOW_PAGE_SIZE = 16
"""Below this many tokens per page ``simulate`` says why the replay is slow (``small_page_hint``)."""


def small_page_hint(page_size: int, pages_per_lane: int) -> str | None:
    """One line for a page size that makes the replay slow, else None.

    The replay's cost grows with pages, not tokens: ``--page-size 1`` handles 64x the pages of the default
    64 and replays about 10x slower or more (measured, synthetic workload), and ``pages_per_lane`` counts
    pages, so the same pool holds 64x fewer tokens (more eviction, which costs time too).
    """
    if page_size >= SLOW_PAGE_SIZE:
        return None
    factor = DEFAULT_PAGE_SIZE // page_size
    return (
        f"--page-size {page_size} gives {factor}x the pages of --page-size {DEFAULT_PAGE_SIZE}: the replay runs "
        f"several times slower (10x or more at 1), and {pages_per_lane:,} pages per lane hold only "
        f"{pages_per_lane * page_size:,} tokens"
    )


def interrupted_line(e, out_dir: Path) -> str:
    """What a Ctrl-C during ``simulate`` kept, in one line (``e``: ``SimulationInterrupted``)."""
    done = [r.policy for r in e.result.results]
    if not done:
        return "interrupted before any policy finished; nothing was written"
    head = f"interrupted after {', '.join(done)} ({', '.join(e.pending)} not run)"
    if e.write_error is not None:
        return f"{head}; the table above has the finished results, but {e.write_error}"
    return f"{head}; wrote the finished policies to {out_dir} (report.json status: interrupted)"


def check_out_dir(out_dir: Path, names: tuple[str, ...] | None = None) -> None:
    """Fail before any work when ``out_dir`` cannot receive the files ``names`` (default: the report's,
    ``sim.report.OUTPUT_FILES``) (InputError, exit 2).

    Creates nothing: an existing ``out_dir`` must be a writable directory whose report names are free of
    directories; a new one needs its nearest existing parent to be a writable directory.
    """
    from ..sim.report import OUTPUT_FILES, STORAGE_FIGURE

    existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise InputError(f"--out {out_dir}: {existing} exists and is not a directory")
    if not os.access(existing, os.W_OK):
        raise InputError(f"--out {out_dir}: {existing} is not writable")
    blocked = [
        name
        for name in ((*OUTPUT_FILES, STORAGE_FIGURE) if names is None else names)
        if (out_dir / name).is_dir()
    ]
    if blocked:
        raise InputError(f"--out {out_dir}: {', '.join(blocked)} is a directory")
