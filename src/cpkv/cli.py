"""The ``cpkv`` command line: ``plan`` (owner plans), ``simulate`` (trace replay), ``run-dist``."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import click

from .cost.spec import DEFAULT_BACKEND, DEFAULT_GPU, DEFAULT_MODEL, MeasuredSpec
from .errors import CpkvError
from .sim.config import SimConfig


class InputError(CpkvError, ValueError):
    """Bad command-line input (a file, a flag combination); exits 2 with a one-line message."""


class FilePath(click.Path):
    """``click.Path`` giving a ``Path`` that refuses the empty string, which ``Path("")`` would turn into
    ``.``, the current directory (``--out ""`` would write the report there): a usage error naming the flag."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(self, value, param, ctx):
        """The path as a ``Path``; ``""`` fails (exit 2, "Invalid value for '--out': the path is empty")."""
        if value == "":
            self.fail("the path is empty; give a file or directory name", param, ctx)
        return super().convert(value, param, ctx)


def parse_pages_per_lane(ctx, param, value: str | None) -> int | tuple[int, ...] | None:
    """Click callback of ``--pages-per-lane`` (``simulate`` and ``run-dist``): ``"16384"`` -> 16384 (every
    lane), ``"9,10,10,10"`` -> (9, 10, 10, 10) (one per lane), None stays None; the count and range are the
    config's to check.

    Raises:
        click.BadParameter: a part that is not an integer (exit 2, one line).
    """
    if value is None:
        return None
    try:
        parts = [int(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an int or a comma-separated list of ints") from None
    return parts[0] if len(parts) == 1 else tuple(parts)


class _LazyGroup(click.Group):
    """A command group whose heavy commands load on first use: ``run-dist`` pulls in torch and the
    executor, so ``cpkv plan`` and ``cpkv simulate`` start without them. ``lazy`` maps a command name to
    ``(module, attribute)``; the command is defined once, there (``cpkv.executor`` reuses it)."""

    lazy = {"run-dist": ("cpkv.executor.cli_entry", "run_dist_cli")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, attr = self.lazy[name]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup, help="cpkv: context-parallel prefill with an owner-lane sharded, paged KV cache.")
@click.version_option(package_name="cpkv")
def app() -> None:
    """The ``cpkv`` command group."""


@app.command()
@click.option("--prefix-len", type=int, multiple=True, help="Tokens already cached; repeat once per request.")
@click.option("--extend-len", type=int, multiple=True, help="New tokens; repeat once per request.")
@click.option("--page-size", type=int, default=SimConfig.page_size, show_default=True, help="Tokens per KV page (P).")
@click.option("--cp-size", type=int, default=SimConfig.cp_size, show_default=True,
              help="Ranks in the CP group (C), at most 4096 (cpkv.limits.MAX_CP_SIZE).")  # fmt: skip
@click.option("--req-index", type=int, default=None, help="Batch position of a single request (phase input).")
@click.option("--head-owner", type=int, multiple=True, help="Lane of each request's last_loc page (-1: none).")
@click.option("--policy", type=click.Choice(["rotation", "legacy", "balanced"]), default=None,
              help="Owner policy (default: $CPKV_OWNER_POLICY, else balanced).")  # fmt: skip
@click.option("--batch", type=FilePath(), default=None,
              help="JSON list of {prefix_len, extend_len[, head_owner]} instead of the flags.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(prefix_len, extend_len, page_size, cp_size, req_index, head_owner, policy, batch, as_json) -> None:
    """Plan page owners for one request or a batch: phase, lane strip, per-rank tokens, MQA-logits.

    \b
    The "page owners" column has one character per new page: the lane
    that owns it (0-9, then a-z). Above 96 pages, or with more than 36
    lanes, it is run-length encoded as LANExCOUNT: "0x13 1x13 2x13" is
    13 pages on lane 0, then 13 on lane 1, then 13 on lane 2.
    """
    prefix_len, extend_len, head_owner = list(prefix_len), list(extend_len), list(head_owner)
    from .config import CPConfig
    from .plan_view import plan_to_dict, print_plan
    from .planner import plan_batch, plan_request

    if batch is not None:
        if prefix_len or extend_len or head_owner:
            raise InputError("--batch cannot be combined with --prefix-len/--extend-len/--head-owner")
        prefix_len, extend_len, head_owner = read_batch_file(batch)
    if not prefix_len and not extend_len:
        raise InputError("give at least one request (--prefix-len N --extend-len M, or --batch FILE)")
    if len(prefix_len) != len(extend_len):
        raise InputError(f"give one --prefix-len per --extend-len (got {len(prefix_len)} and {len(extend_len)})")
    if head_owner and len(head_owner) != len(extend_len):
        raise InputError(f"give one --head-owner per request or none (got {len(head_owner)} for {len(extend_len)})")
    config = CPConfig(cp_size, page_size, policy)
    heads = [None if h == -1 else h for h in head_owner] if head_owner else None
    if req_index is not None:
        if len(extend_len) != 1:
            raise InputError(f"--req-index={req_index} applies to a single request, got {len(extend_len)}")
        one = plan_request(prefix_len[0], extend_len[0], config, req_index=req_index, head_owner=(heads or [None])[0])
        result = plan_batch([prefix_len[0]], [extend_len[0]], config, head_owners=heads, phases=[one.phase])
        summary = plan_to_dict(result)
        summary["requests"][0]["req_index"] = req_index
    else:
        summary = plan_to_dict(plan_batch(prefix_len, extend_len, config, head_owners=heads))
    flag = "head_owner" if batch is not None else "--head-owner"
    for line in ignored_head_owners(summary["requests"], heads or [], page_size, flag):
        click.echo(f"cpkv: warning: {line}", err=True)
    if as_json:
        dump_json(summary)
    else:
        print_plan(summary)


@app.command()
@click.option("--trace", type=FilePath(), default=None, help="Mooncake-format JSONL trace.")
@click.option("--workload", type=click.Choice(["synthetic", "tiny-chunks", "tiny-chunks-reload", "short-prompts"]),
              default=None, help="Built-in workload when no --trace is given (default: synthetic).")  # fmt: skip
@click.option("--cp-size", type=int, default=SimConfig.cp_size, show_default=True,
              help="Ranks in the CP group (C), at most 4096 (cpkv.limits.MAX_CP_SIZE).")  # fmt: skip
@click.option("--page-size", type=int, default=SimConfig.page_size, show_default=True, help="Tokens per KV page (P).")
@click.option("--pages-per-lane", type=str, default=None, callback=parse_pages_per_lane,
              help=f"Device pages per lane: N, or one per lane as 9,10,10,10 (ranks with unequal free memory) "
                   f"[{SimConfig.pages_per_lane}; the lane-skew workloads size their own pool, docs/metrics.md].")  # fmt: skip
@click.option("--host-pages-per-lane", type=int, default=None,
              help=f"Host-tier pages per lane [{SimConfig.host_pages_per_lane}; tiny-chunks-reload: enough for every "
                   "prompt page].")  # fmt: skip
@click.option("--chunk-size", type=int, default=None,
              help=f"Most tokens a request prefills per step [{SimConfig.chunk_size}].")  # fmt: skip
@click.option("--max-batch-tokens", type=int, default=None,
              help=f"Most prefill tokens per step [max(2 x chunk size, {SimConfig.max_batch_tokens})].")  # fmt: skip
@click.option("--logits-budget-mb", type=float, default=SimConfig.logits_budget_mb, show_default=True,
              help="MQA-logits buffer budget per rank in MiB (0: off).")  # fmt: skip
@click.option("--colocated-decode", is_flag=True, help="Keep pages for output_length decode steps.")
@click.option("--spec-draft-tokens", type=int, default=SimConfig.spec_draft_tokens, show_default=True,
              help="MTP decode: KV slots per request per step (root + K-1 drafts; alloc_draft, release_tail). "
                   "Implies --colocated-decode; 0: plain decode.")  # fmt: skip
@click.option("--spec-accept-rate", type=float, default=SimConfig.spec_accept_rate, show_default=True,
              help="Per-draft-token acceptance probability of --spec-draft-tokens (seeded, geometric).")
@click.option("--policy", "policies", multiple=True, default=["all"], show_default=True,
              type=click.Choice(["rotation", "legacy", "balanced", "all"]), help="Owner policy; repeatable.")
@click.option("--cost-model", type=click.Choice(["measured", "illustrative"]), default="measured", show_default=True,
              help="What prices each step: aiconfigurator's measured operator latencies (the `cost` extra) "
                   "or three illustrative constants (not a GPU's).")  # fmt: skip
@click.option("--gpu", default=None, help=f"Measured: aiconfigurator system [{DEFAULT_GPU}].")
@click.option("--model", default=None, help=f"Measured: DeepSeek sparse-attention model [{DEFAULT_MODEL}].")
@click.option("--backend", type=click.Choice(["sglang", "vllm", "trtllm"]), default=None,
              help=f"Measured: engine whose kernels were timed [{DEFAULT_BACKEND}].")  # fmt: skip
@click.option("--ep-size", type=int, default=None,
              help="Measured: MoE expert-parallel GPUs, a divisor of --cp-size [--cp-size]; attention runs one "
                   "rank per GPU (SGLang CP has no attention TP, so there is no --tp-size).")  # fmt: skip
@click.option("--max-requests", type=int, default=None, help="Replay only the first N requests.")
@click.option("--seed", type=int, default=SimConfig.seed, show_default=True, help="Seed of the built-in workloads.")
@click.option("--out", "out_dir", type=FilePath(), default=Path("out/simulate"),
              show_default=True, help="Directory for report.json, summary.csv, lanes.png.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def simulate(trace, workload, cp_size, page_size, pages_per_lane, host_pages_per_lane, chunk_size,
             max_batch_tokens, logits_budget_mb, colocated_decode, spec_draft_tokens, spec_accept_rate, policies,
             cost_model, gpu, model, backend, ep_size, max_requests, seed, out_dir, no_progress) -> None:  # fmt: skip
    """Replay traffic through one CP prefill group under each owner policy; write a side-by-side report.

    The output directory is created and probed before the replay, the report is rewritten after each
    policy (report.json "status": "incomplete" until the last) and every file is replaced atomically.
    Ctrl-C writes the finished policies ("status": "interrupted") and exits 130; a file that still cannot
    be written at the end is named on one line after the table (exit 2).

    Times are H200 milliseconds of DeepSeek-V3.2 on SGLang by default (--cost-model measured, the `cost`
    extra: pip install 'cpkv[cost]'); docs/cost-model.md says what they hold.
    """
    from .config import check_int
    from .sim.config import check_policies
    from .sim.runner import SimulationInterrupted
    from .sim.runner import simulate as run_simulation
    from .sim.workload import build_workload

    if trace is not None and workload is not None:
        raise InputError(f"give --trace or --workload, not both (got --workload {workload})")
    name = "trace" if trace is not None else workload or "synthetic"
    if max_requests is not None:
        check_int("--max-requests", max_requests, 1)  # named as given (the workloads call it num_requests)
    check_out_dir(out_dir)
    measured = measured_spec(cost_model, gpu, model, backend, ep_size)
    spec = build_workload(name, num_requests=max_requests, seed=seed, trace_path=trace, page_size=page_size)
    config = SimConfig.for_workload(
        spec, cp_size=cp_size, page_size=page_size, pages_per_lane=pages_per_lane,
        host_pages_per_lane=host_pages_per_lane, chunk_size=chunk_size, max_batch_tokens=max_batch_tokens,
        logits_budget_mb=logits_budget_mb, colocated_decode=colocated_decode, seed=seed,
        spec_draft_tokens=spec_draft_tokens, spec_accept_rate=spec_accept_rate, measured=measured,
    )  # fmt: skip
    hint = small_page_hint(config.page_size, min(config.lane_capacities))
    if hint:
        click.echo(f"cpkv: note: {hint}", err=True)
    try:
        result = run_simulation(config, spec, check_policies(list(policies)), out_dir=out_dir, progress=not no_progress)
    except SimulationInterrupted as e:
        raise click.exceptions.Abort(interrupted_line(e, out_dir)) from None  # main prints it on one line
    click.echo(f"wrote {', '.join(str(p) for p in result.paths)}")


def measured_spec(cost_model: str, gpu, model, backend, ep_size):
    """``simulate``'s ``MeasuredSpec`` (defaults for the names not given), or None for the illustrative
    model; InputError for a measured-only flag given with ``--cost-model illustrative``."""
    given = {"--gpu": gpu, "--model": model, "--backend": backend, "--ep-size": ep_size}
    if cost_model == "illustrative":
        extra = [flag for flag, v in given.items() if v is not None]
        if extra:
            raise InputError(f"{', '.join(extra)} price the measured model; drop them or use --cost-model measured")
        return None
    return MeasuredSpec(gpu=gpu or DEFAULT_GPU, model=model or DEFAULT_MODEL, backend=backend or DEFAULT_BACKEND,
                        ep_size=ep_size)  # fmt: skip


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
    return (f"--page-size {page_size} gives {factor}x the pages of --page-size {SimConfig.page_size}: the replay runs "
            f"several times slower (10x or more at 1), and {pages_per_lane:,} pages per lane hold only "
            f"{pages_per_lane * page_size:,} tokens")  # fmt: skip


def interrupted_line(e, out_dir: Path) -> str:
    """What a Ctrl-C during ``simulate`` kept, in one line (``e``: ``SimulationInterrupted``)."""
    done = [r.policy for r in e.result.results]
    if not done:
        return "interrupted before any policy finished; nothing was written"
    head = f"interrupted after {', '.join(done)} ({', '.join(e.pending)} not run)"
    if e.write_error is not None:
        return f"{head}; the table above has the finished results, but {e.write_error}"
    return f"{head}; wrote the finished policies to {out_dir} (report.json status: interrupted)"


def check_out_dir(out_dir: Path) -> None:
    """Fail before any work when ``out_dir`` cannot receive the report files (InputError, exit 2).

    Creates nothing: an existing ``out_dir`` must be a writable directory whose report names are free of
    directories; a new one needs its nearest existing parent to be a writable directory.
    """
    from .sim.report import OUTPUT_FILES

    existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise InputError(f"--out {out_dir}: {existing} exists and is not a directory")
    if not os.access(existing, os.W_OK):
        raise InputError(f"--out {out_dir}: {existing} is not writable")
    blocked = [name for name in OUTPUT_FILES if (out_dir / name).is_dir()]
    if blocked:
        raise InputError(f"--out {out_dir}: {', '.join(blocked)} is a directory")


def ignored_head_owners(requests: list[dict], heads: list[int | None], page_size: int, flag: str) -> list[str]:
    """One line per request given a head owner that its plan ignores: it has no head tokens (C-HEAD)
    because its prefix fills whole pages or it computes nothing. ``requests``: ``plan_to_dict`` rows."""
    lines = []
    for i, (r, head) in enumerate(zip(requests, heads, strict=False)):
        if head is None or r["head_tokens"]:
            continue
        why = (f"prefix_len={r['prefix_len']} fills whole pages" if r["prefix_len"] % page_size == 0
               else f"extend_len={r['extend_len']} computes no token")  # fmt: skip
        lines.append(f"request {i}: {flag} {head} is ignored: {why} (no head tokens)")
    return lines


def read_batch_file(path: Path) -> tuple[list[int], list[int], list[int]]:
    """Read ``[{"prefix_len": int, "extend_len": int, "head_owner"?: int | null}, ...]`` from ``path``.

    Raises:
        InputError: unreadable file, bad JSON or a bad entry (names the file and the entry index).
    """
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read batch file: {e}") from None
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{path}: expected a non-empty JSON list of requests")
    out: tuple[list[int], list[int], list[int]] = ([], [], [])
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not {"prefix_len", "extend_len"} <= row.keys():
            raise InputError(f"{path}: entry {i} needs prefix_len and extend_len, got {row!r}")
        unknown = sorted(row.keys() - {"prefix_len", "extend_len", "head_owner"})
        if unknown:
            raise InputError(f"{path}: entry {i} has unknown keys {unknown} (use prefix_len, extend_len, head_owner)")
        head = row.get("head_owner")
        values = (row["prefix_len"], row["extend_len"], -1 if head is None else head)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise InputError(f"{path}: entry {i} must hold integers, got {row!r}")
        for lst, v in zip(out, values, strict=True):
            lst.append(v)
    return out


def main(argv: list[str] | None = None) -> int:
    """Console entry point: bad input prints one line to stderr and exits 2; Ctrl-C (at any moment, torch's
    import included) prints ``cpkv: aborted`` (``simulate`` adds what it saved on the same line) and exits 130.

    The context is made and invoked here rather than through click's ``main``, whose Ctrl-C handling
    prints an empty line before any message of ours.
    """
    try:
        with app.make_context("cpkv", list(sys.argv[1:] if argv is None else argv)) as ctx:
            rv = app.invoke(ctx)
    except click.exceptions.Exit as e:  # --help, --version
        return e.exit_code
    except click.exceptions.UsageError as e:
        print(f"cpkv: error: {e.format_message()}", file=sys.stderr)
        return 2
    except CpkvError as e:
        print(f"cpkv: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"cpkv: error: the input is too large to plan in this machine's memory ({e})", file=sys.stderr)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt) as e:
        said = str(e) if isinstance(e, click.exceptions.Abort) else ""  # what a command saved, if it says
        print(f"cpkv: aborted: {said}" if said else "cpkv: aborted", file=sys.stderr)
        return 130
    return rv if isinstance(rv, int) else 0


def dump_json(obj: object) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    click.echo(json.dumps(obj, indent=2))


if __name__ == "__main__":
    sys.exit(main())
