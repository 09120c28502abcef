"""``cpkv run-dist`` and ``python -m cpkv.executor``: build one case from flags, run it, summarise.

``run_dist_command`` spawns the ranks itself; ``__main__`` runs one rank of a torchrun world with the same
flags (``run_dist_options``), so both entry points share one definition of the options.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

from ..config import CP_STRATEGIES, DEFAULT_PAGE_SIZE, OWNER_POLICIES, CPConfig, check_int, per_lane_ints
from ..errors import ConfigError, InputError, LaneExhausted
from ..validate import parse_pages_per_lane
from .case import DistCase
from .forward import KV_ACCESSES
from .model import ATTENTIONS, KV_MODES, TinyDecoderConfig
from .summary import TOLERANCE, DistCommandResult
from .workload import make_workload

__all__ = [
    "TOLERANCE",
    "DistCommandResult",
    "build_case",
    "run_dist_cli",
    "run_dist_command",
    "run_dist_options",
]

DEFAULT_PREFIX_LENS = (0, 100)
DEFAULT_EXTEND_LENS = (300, 50)


def _pages_per_lane(ctx, param, value: str | None) -> int | tuple[int, ...] | None:
    """Click callback of ``--pages-per-lane`` (``validate.parse_pages_per_lane``); a bad part is a usage error
    (exit 2, "Invalid value for '--pages-per-lane': ...")."""
    try:
        return parse_pages_per_lane(value)
    except InputError as e:
        raise click.BadParameter(str(e)) from None


def run_dist_options(f):
    """Click options shared by ``cpkv run-dist`` and ``python -m cpkv.executor`` (all but ``--cp-size``)."""
    options = [
        click.option(
            "--page-size",
            type=int,
            default=DEFAULT_PAGE_SIZE,
            show_default=True,
            help="Tokens per KV page (P); the same default as plan and simulate.",
        ),
        click.option(
            "--pages-per-lane",
            type=str,
            default=None,
            callback=_pages_per_lane,
            help="Pages per lane (Q): one int, or one per lane for ranks with unequal free memory "
            "(e.g. 9,10,10,10). Lane 0 loses page 0 (reserved for padding writes). Default: "
            "enough for every request on one lane.",
        ),
        click.option(
            "--policy",
            type=click.Choice(list(OWNER_POLICIES)),
            default=None,
            help="Owner policy (default: $CPKV_OWNER_POLICY, else balanced).",
        ),
        click.option(
            "--cp-strategy",
            type=click.Choice(list(CP_STRATEGIES)),
            default=None,
            help="CP strategy: zigzag (2C contiguous segments, C-ZIGZAG) or interleave (new page k on "
            "lane (phase + k) % C, C-INTERLEAVE) (default: $CPKV_CP_STRATEGY, else zigzag).",
        ),
        click.option(
            "--layers", type=int, default=2, show_default=True, help="Decoder layers of the tiny model."
        ),
        click.option(
            "--kv-mode",
            type=click.Choice(list(KV_MODES)),
            default="mla",
            show_default=True,
            help="mla: one 576-wide latent KV row per token; mha: K and V of every head.",
        ),
        click.option(
            "--attention",
            type=click.Choice(list(ATTENTIONS)),
            default="dense",
            show_default=True,
            help="dense: causal MLA/MHA; nsa: DeepSeek sparse attention (lightning indexer with an "
            "index-K pool, top-k, sparse MLA; needs --kv-mode mla).",
        ),
        click.option(
            "--index-topk", type=int, default=2048, show_default=True, help="nsa: keys each query keeps (k)."
        ),
        click.option(
            "--index-heads",
            type=int,
            default=64,
            show_default=True,
            help="nsa: indexer query heads (H); q_I is [H, 128], k_I [128].",
        ),
        click.option(
            "--kv-access",
            type=click.Choice(list(KV_ACCESSES)),
            default="shared",
            show_default=True,
            help="shared: every rank reads any lane through one rank-major view (/dev/shm file, or a "
            "mirror); local: a rank holds, writes and reads only its own lane, queries are "
            "all-gathered and per-rank partial attention merged exactly (C-MERGE).",
        ),
        click.option(
            "--decode-steps",
            type=int,
            default=0,
            show_default=True,
            help="Greedy decode steps per request after its prompt (seeded LM head; alloc_decode "
            "places each token's page, its owner computes it).",
        ),
        click.option(
            "--prefix-len",
            "prefix_lens",
            type=int,
            multiple=True,
            help="Tokens already in the KV cache (a first forward fills them); repeat per request. "
            f"Default {' '.join(map(str, DEFAULT_PREFIX_LENS))}.",
        ),
        click.option(
            "--extend-len",
            "extend_lens",
            type=int,
            multiple=True,
            help=f"New tokens; repeat per request. Default {' '.join(map(str, DEFAULT_EXTEND_LENS))}.",
        ),
        click.option(
            "--chunks",
            type=int,
            default=2,
            show_default=True,
            help="Forwards each extend is split into (chunked prefill).",
        ),
        click.option(
            "--reuse/--no-reuse",
            default=True,
            show_default=True,
            help="Run a second wave of requests that hit the prefix cache.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of weights and token ids."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def build_case(
    cp_size: int,
    *,
    page_size: int = DEFAULT_PAGE_SIZE,
    pages_per_lane: int | Sequence[int] | None = None,
    policy: str | None = None,
    cp_strategy: str | None = None,
    layers: int = 2,
    kv_mode: str = "mla",
    attention: str = "dense",
    index_topk: int = 2048,
    index_heads: int = 64,
    prefix_lens: Sequence[int] = (),
    extend_lens: Sequence[int] = (),
    chunks: int = 2,
    reuse: bool = True,
    seed: int = 0,
    kv_access: str = "shared",
    decode_steps: int = 0,
) -> DistCase:
    """The ``DistCase`` the command-line flags describe (empty lengths take the defaults).

    Raises:
        ConfigError / PlanError: a bad size, policy, CP strategy, attention, access, decode steps or length
            list (names the flag's value).
    """
    prefix_lens, extend_lens = list(prefix_lens), list(extend_lens)
    if not prefix_lens and not extend_lens:
        prefix_lens, extend_lens = list(DEFAULT_PREFIX_LENS), list(DEFAULT_EXTEND_LENS)
    config = CPConfig(
        cp_size, page_size, policy, cp_strategy
    )  # validates, resolves policy and strategy, once
    if pages_per_lane is not None:
        pages_per_lane = tuple(per_lane_ints("--pages-per-lane", pages_per_lane, cp_size, 1))
    model = TinyDecoderConfig(
        num_layers=check_int("layers", layers, 1),
        kv_mode=kv_mode,
        seed=seed,
        attention=attention,
        index_topk=index_topk,
        index_heads=index_heads,
    )
    workload = make_workload(
        prefix_lens, extend_lens, chunks=chunks, vocab_size=model.vocab_size, seed=seed, reuse=reuse
    )
    if kv_access not in KV_ACCESSES:
        raise ConfigError(f"--kv-access {kv_access!r} unknown; use one of {', '.join(KV_ACCESSES)}")
    return DistCase(
        workload=workload,
        page_size=config.page_size,
        pages_per_lane=pages_per_lane,
        policy=config.owner_policy,
        cp_strategy=config.cp_strategy,
        model=model,
        kv_access=kv_access,
        decode_steps=check_int("--decode-steps", decode_steps, 0),
        name="cli",
    )


def run_dist_command(
    *, cp_size: int, timeout_s: float = 120.0, backend: str | None = None, **flags
) -> DistCommandResult:
    """Spawn ``cp_size`` ranks, run the flags' case, compare with the single-process reference.

    Args: ``cp_size`` (C); ``flags``: the keyword arguments of ``build_case`` (the flags of
    ``cpkv run-dist``, lengths in tokens); ``timeout_s`` bounds each collective.

    Returns:
        ``DistCommandResult``; print ``.summary()`` or ``.to_dict()``.

    Raises:
        ConfigError / PlanError: bad flags, or ``--pages-per-lane`` too small (the message names the lane,
            its pages and, for lane 0, that page 0 is reserved).
        LaunchError: a rank did not finish in time (all ranks are stopped).
        KeyboardInterrupt: Ctrl-C; every rank is stopped and nothing is left behind.
    """
    from .launch import run_dist

    case = build_case(cp_size, **flags)
    try:
        run = run_dist([case], cp_size, backend=backend, timeout_s=timeout_s)
    except LaneExhausted as e:
        raise ConfigError(_explain_short_lane(e, case.resolved_pages_per_lane(cp_size))) from None
    return DistCommandResult.from_case(run.results[0], case.model, run.wall_s)


def _explain_short_lane(e: LaneExhausted, caps: list[int]) -> str:
    q = caps[e.lane]
    usable = (
        f"{q - 1} usable: page 0 is reserved for padding writes and never handed out" if e.lane == 0 else ""
    )
    return f"{e}. --pages-per-lane gives lane {e.lane} {q} page{'s' * (q != 1)}" + (
        f", {usable}" if usable else ""
    )


@click.command("run-dist")
@click.option(
    "--cp-size",
    type=int,
    default=4,
    show_default=True,
    help="Ranks to spawn (C), one local process each: gloo on 127.0.0.1, NCCL when there is a GPU "
    "per rank. 4, not simulate's 8: every rank is a real process that imports torch on this "
    "machine.",
)
@run_dist_options
def run_dist_cli(cp_size, as_json, **flags) -> int:
    """Run CP prefill of a tiny decoder on C local processes; print max abs error vs one process.

    Each rank embeds and computes only the tokens it owns, writes their KV into its own lane of a shared
    paged buffer, reads every earlier position through the rank-major view (--kv-access local: holds only
    its own lane; queries are all-gathered and per-rank partials merged), and the outputs are gathered
    back into flat order. --decode-steps N then decodes N greedy tokens per request on the owner lanes. With --attention nsa each rank also writes its tokens' index keys into the
    index-K pool, materialises the indexer's logits blocks of its runs of positions and counts them
    against mqa_logits_elements. Exit status 1 when the error exceeds 1e-5, a logits count differs from
    the estimate, a top-k row differs from the reference away from a near tie, or a decoded token differs
    from the reference's greedy choice; 130 on Ctrl-C.
    """
    try:
        result = run_dist_command(cp_size=cp_size, **flags)
    except KeyboardInterrupt:
        raise click.exceptions.Abort() from None  # every rank is already stopped; `cpkv: aborted`, exit 130
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.summary())
    return 0 if result.ok else 1
