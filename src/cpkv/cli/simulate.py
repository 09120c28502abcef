"""``cpkv simulate``: replay traffic through one CP prefill group under each owner policy, KV storage design and
CP strategy (``cpkv.sim``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from ..config import CP_STRATEGIES, OWNER_POLICIES, ZIGZAG
from ..cost.spec import DEFAULT_BACKEND, DEFAULT_GPU, DEFAULT_MODEL, MeasuredSpec
from ..sim.config import KV_STORAGE_DESIGNS, OWNER_LANE, SimConfig
from .options import FilePath, InputError, parse_pages_per_lane


@click.command()
@click.option("--trace", type=FilePath(), default=None, help="Mooncake-format JSONL trace.")
@click.option(
    "--workload",
    type=click.Choice(["synthetic", "tiny-chunks", "tiny-chunks-reload", "short-prompts"]),
    default=None,
    help="Built-in workload when no --trace is given (default: synthetic).",
)
@click.option(
    "--cp-size",
    type=int,
    default=SimConfig.cp_size,
    show_default=True,
    help="Ranks in the CP group (C), at most 4096 (cpkv.limits.MAX_CP_SIZE).",
)
@click.option(
    "--page-size", type=int, default=SimConfig.page_size, show_default=True, help="Tokens per KV page (P)."
)
@click.option(
    "--pages-per-lane",
    type=str,
    default=None,
    callback=parse_pages_per_lane,
    help=f"Device pages per lane: N, or one per lane as 9,10,10,10 (ranks with unequal free memory), or "
    f"auto [auto: what one GPU holds under --cost-model measured (aiconfigurator's KV-cache "
    f"estimator, docs/cost-model.md), {SimConfig.pages_per_lane} under illustrative; the lane-skew "
    f"workloads size their own pool, docs/metrics.md].",
)
@click.option(
    "--host-pages-per-lane",
    type=int,
    default=None,
    help=f"Host-tier pages per lane [{SimConfig.host_pages_per_lane}; tiny-chunks-reload: enough for every "
    "prompt page].",
)
@click.option(
    "--chunk-size",
    type=int,
    default=None,
    help=f"Most tokens a request prefills per step [{SimConfig.chunk_size}].",
)
@click.option(
    "--max-batch-tokens",
    type=int,
    default=None,
    help=f"Most prefill tokens per step [max(2 x chunk size, {SimConfig.max_batch_tokens})].",
)
@click.option(
    "--logits-budget-mb",
    type=float,
    default=SimConfig.logits_budget_mb,
    show_default=True,
    help="MQA-logits buffer budget per rank in MiB (0: off).",
)
@click.option("--colocated-decode", is_flag=True, help="Keep pages for output_length decode steps.")
@click.option(
    "--spec-draft-tokens",
    type=int,
    default=SimConfig.spec_draft_tokens,
    show_default=True,
    help="MTP decode: KV slots per request per step (root + K-1 drafts; alloc_draft, release_tail). "
    "Implies --colocated-decode; 0: plain decode.",
)
@click.option(
    "--spec-accept-rate",
    type=float,
    default=SimConfig.spec_accept_rate,
    show_default=True,
    help="Per-draft-token acceptance probability of --spec-draft-tokens (seeded, geometric).",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    default=["all"],
    show_default=True,
    type=click.Choice([*OWNER_POLICIES, "all"]),
    help="Owner policy; repeatable.",
)
@click.option(
    "--kv-storage",
    "kv_storage",
    multiple=True,
    default=[OWNER_LANE],
    show_default=True,
    type=click.Choice([*KV_STORAGE_DESIGNS, "all"]),
    help="KV storage design (SPEC C-STORAGE, docs/storage-models.md); repeatable. Owner policies place "
    "owner-lane's pages; the other designs run once each with their own placement.",
)
@click.option(
    "--cp-strategy",
    "cp_strategies",
    multiple=True,
    default=[ZIGZAG],
    show_default=True,
    type=click.Choice([*CP_STRATEGIES, "all"]),
    help="CP strategy (SPEC C-ZIGZAG, C-INTERLEAVE): how a request's new pages go to the ranks that own "
    "and compute them; repeatable. Every design and policy runs under each.",
)
@click.option(
    "--cost-model",
    type=click.Choice(["measured", "illustrative"]),
    default="measured",
    show_default=True,
    help="What prices each step: aiconfigurator's measured operator latencies (the `cost` extra) "
    "or three illustrative constants (not a GPU's).",
)
@click.option("--gpu", default=None, help=f"Measured: aiconfigurator system [{DEFAULT_GPU}].")
@click.option(
    "--model",
    default=None,
    help=f"Measured: DeepSeek sparse-attention model the installed aiconfigurator "
    f"data holds, e.g. zai-org/GLM-5 [{DEFAULT_MODEL}].",
)
@click.option(
    "--backend",
    type=click.Choice(["sglang", "vllm", "trtllm"]),
    default=None,
    help=f"Measured: engine whose kernels were timed [{DEFAULT_BACKEND}].",
)
@click.option(
    "--ep-size",
    type=int,
    default=None,
    help="Measured: MoE expert-parallel GPUs, a divisor of --cp-size [--cp-size]; attention runs one "
    "rank per GPU (SGLang CP has no attention TP, so there is no --tp-size).",
)
@click.option(
    "--ttft-slo-ms",
    type=float,
    default=None,
    help="TTFT objective in ms: the report adds slo_attainment, the share of all requests (unfinished "
    "ones miss it) whose TTFT is at most this [off].",
)
@click.option(
    "--max-requests", type=int, default=None, help="Replay only the first N requests (of the window)."
)
@click.option(
    "--start",
    type=float,
    default=None,
    help="Replay the requests arriving from this many seconds into the workload (shifted to 0) [0].",
)
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Replay the requests arriving within this many seconds of --start [to the end].",
)
@click.option(
    "--rate-scale",
    type=float,
    default=None,
    help="Compress the arrivals by X (2: twice the traffic, the same requests in half the time) [1].",
)
@click.option(
    "--seed", type=int, default=SimConfig.seed, show_default=True, help="Seed of the built-in workloads."
)
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
    from ..sim.config import check_designs, check_policies, check_strategies
    from ..sim.report import prepare_out_dir
    from ..sim.runner import SimulationInterrupted
    from ..sim.runner import simulate as run_simulation

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
    policies = check_policies(list(options["policies"]))
    designs, strategies = (
        check_designs(list(options[STORAGE_OPTION])),
        check_strategies(list(options[STRATEGY_OPTION])),
    )
    lines = load_summary(config, spec.requests)
    prepare_out_dir(out_dir)  # as the replay does first: an output that fails prints nothing before its error
    click.echo("\n".join(lines))
    try:
        result = run_simulation(
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


# ------------------------------------------------------------ from options to a replay (simulate, sweep)
REPORT_OPTIONS = ("out_dir", "no_progress")
"""``simulate`` options that say where and how to report, not what to simulate."""
WORKLOAD_OPTIONS = ("trace", "workload", "max_requests", "start", "duration", "rate_scale")
"""``simulate`` options that choose the requests (``workload_of``; ``seed`` and ``page_size`` shape the
generated ones too)."""
WINDOW_OPTIONS = ("start", "duration", "rate_scale")
"""The traffic window (``sim.window.traffic_window``), applied before ``max_requests``."""
COST_OPTIONS = ("cost_model", "gpu", "model", "backend", "ep_size")
"""``simulate`` options that make ``SimConfig.measured`` (``measured_spec``)."""
POLICY_OPTION = "policies"
"""The ``--policy`` option (repeatable): which replays to run, not part of the ``SimConfig``."""
STORAGE_OPTION = "kv_storage"
"""The ``--kv-storage`` option (repeatable): which KV storage designs to replay, not part of the ``SimConfig``."""
STRATEGY_OPTION = "cp_strategies"
"""The ``--cp-strategy`` option (repeatable): which CP strategies to replay; ``config_of`` puts the first into
``SimConfig.cp_strategy`` (a sweep point has one)."""


def setting_options() -> dict[str, click.Option]:
    """The table of ``simulate``'s settings: ``{name: click option}`` for every option but the report's
    (``REPORT_OPTIONS``), named by the option's long flag (``--cp-size`` -> ``cp_size``, ``--policy`` ->
    ``policy``). ``cpkv sweep`` takes its grid keys from it, so a setting added here is a grid key."""
    return {
        next(o for o in p.opts if o.startswith("--"))[2:].replace("-", "_"): p
        for p in simulate.params
        if p.name not in REPORT_OPTIONS
    }


def check_workload_options(options: dict) -> None:
    """InputError for ``--trace`` with ``--workload``, or a ``--max-requests`` below 1."""
    from ..validate import check_int

    if options["trace"] is not None and options["workload"] is not None:
        raise InputError(f"give --trace or --workload, not both (got --workload {options['workload']})")
    if options["max_requests"] is not None:
        check_int(
            "--max-requests", options["max_requests"], 1
        )  # named as given (the workloads: num_requests)


def workload_of(options: dict):
    """The ``WorkloadSpec`` that ``options`` (``simulate``'s parameters by name) name: the trace, or the
    built-in workload (default ``synthetic``), cut to the traffic window (``--start``, ``--duration``,
    ``--rate-scale``; ``sim.window.traffic_window``), its first ``max_requests``.

    Raises: InputError (``check_workload_options``), ConfigError, TraceError (``build_workload``)."""
    from dataclasses import replace

    from ..sim.window import traffic_window
    from ..sim.workload import build_workload

    check_workload_options(options)
    trace = options["trace"]
    name = "trace" if trace is not None else options["workload"] or "synthetic"
    window = [options.get(k) for k in WINDOW_OPTIONS]
    cap = options["max_requests"]
    spec = build_workload(
        name,
        num_requests=None if trace is not None and any(v is not None for v in window) else cap,
        seed=options["seed"],
        trace_path=trace,
        page_size=options["page_size"],
    )
    spec = traffic_window(spec, *window)
    if cap is not None and len(spec.requests) > cap:
        spec = replace(spec, requests=spec.requests[:cap])
    return spec


def config_of(options: dict, spec) -> SimConfig:
    """The ``SimConfig`` of ``options`` (``simulate``'s parameters by name) for the workload ``spec``:
    every option named like a ``SimConfig`` field is passed as given (None: the workload's or the
    default, ``SimConfig.for_workload``), the cost options make ``measured`` (``measured_spec``), the first
    ``--cp-strategy`` (``all``: zigzag) makes ``cp_strategy``.

    Raises: InputError (a measured-only flag with the illustrative model), ConfigError, CostModelError.
    """
    fields = {f.name for f in dataclasses.fields(SimConfig)}
    settings = {k: v for k, v in options.items() if k in fields}
    strategies = options.get(STRATEGY_OPTION) or (ZIGZAG,)
    settings["cp_strategy"] = CP_STRATEGIES[0] if strategies[0] == "all" else strategies[0]
    measured = measured_spec(*(options[k] for k in COST_OPTIONS))
    return SimConfig.for_workload(spec, **settings, measured=measured)


def measured_spec(cost_model: str, gpu, model, backend, ep_size):
    """``simulate``'s ``MeasuredSpec`` (defaults for the names not given), or None for the illustrative
    model; InputError for a measured-only flag given with ``--cost-model illustrative``."""
    given = {"--gpu": gpu, "--model": model, "--backend": backend, "--ep-size": ep_size}
    if cost_model == "illustrative":
        extra = [flag for flag, v in given.items() if v is not None]
        if extra:
            verb, them = ("applies", "it") if len(extra) == 1 else ("apply", "them")
            raise InputError(
                f"{', '.join(extra)} {verb} only to --cost-model measured: drop {them} or use "
                "--cost-model measured"
            )
        return None
    return MeasuredSpec(
        gpu=gpu or DEFAULT_GPU,
        model=model or DEFAULT_MODEL,
        backend=backend or DEFAULT_BACKEND,
        ep_size=ep_size,
    )


def pool_warning(config: SimConfig, given) -> str | None:
    """One line when an explicit ``--pages-per-lane`` (``given``) is larger than what one GPU holds under the
    measured model (``SimConfig.memory``), naming both sizes, or when the model leaves no pool at all; else
    None. The run goes on: the pool is then hypothetical."""
    memory = config.memory()
    P = config.page_size
    if memory is not None and memory["pages_per_lane"] < 2:
        over = -memory["headroom_bytes"] / 1e9
        return (
            f"{config.measured.model} does not fit {config.cp_size} x {config.measured.gpu} at EP "
            f"{config.measured.ep_for(config.cp_size)}: weights and activations leave no KV pool ({over:,.1f} GB "
            f"short, report.json: config.memory); the pool of {max(config.lane_capacities):,} pages is hypothetical"
        )
    if given is None or memory is None or max(config.lane_capacities) <= memory["pages_per_lane"]:
        return None
    return (
        f"--pages-per-lane {max(config.lane_capacities):,} ({max(config.lane_capacities) * P:,} tokens a GPU) is "
        f"larger than the {memory['pages_per_lane']:,} pages ({memory['kv_pool_tokens']:,} tokens) of KV one "
        f"{config.measured.gpu} holds beside the weights (report.json: config.memory); the pool is hypothetical"
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
    factor = SimConfig.page_size // page_size
    return (
        f"--page-size {page_size} gives {factor}x the pages of --page-size {SimConfig.page_size}: the replay runs "
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
