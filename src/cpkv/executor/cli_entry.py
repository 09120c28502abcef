"""``cpkv run-dist`` and ``python -m cpkv.executor``: build one case from flags, run it, summarise.

``run_dist_command`` spawns the ranks itself; ``__main__`` runs one rank of a torchrun world with the same
flags (``run_dist_options``), so both entry points share one definition of the options.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import click

from ..config import OWNER_POLICIES, CPConfig, check_int
from .case import CaseResult, DistCase
from .model import KV_MODES, TinyDecoderConfig
from .workload import make_workload

TOLERANCE = 1e-5
"""Max abs error (float32) of the CP forward against the single-process reference."""

DEFAULT_PREFIX_LENS = (0, 100)
DEFAULT_EXTEND_LENS = (300, 50)


def run_dist_options(f):
    """Click options shared by ``cpkv run-dist`` and ``python -m cpkv.executor`` (all but ``--cp-size``)."""
    options = [
        click.option("--page-size", type=int, default=16, show_default=True, help="Tokens per KV page (P)."),
        click.option("--pages-per-lane", type=int, default=None,
                     help="Pages per lane (Q); default: enough for every request on one lane."),
        click.option("--policy", type=click.Choice(list(OWNER_POLICIES)), default=None,
                     help="Owner policy (default: $CPKV_OWNER_POLICY, else balanced)."),
        click.option("--layers", type=int, default=2, show_default=True, help="Decoder layers of the tiny model."),
        click.option("--kv-mode", type=click.Choice(list(KV_MODES)), default="mla", show_default=True,
                     help="mla: one 576-wide latent KV row per token; mha: K and V of every head."),
        click.option("--prefix-len", "prefix_lens", type=int, multiple=True,
                     help="Tokens already in the KV cache (a first forward fills them); repeat per request. "
                          f"Default {' '.join(map(str, DEFAULT_PREFIX_LENS))}."),
        click.option("--extend-len", "extend_lens", type=int, multiple=True,
                     help=f"New tokens; repeat per request. Default {' '.join(map(str, DEFAULT_EXTEND_LENS))}."),
        click.option("--chunks", type=int, default=2, show_default=True,
                     help="Forwards each extend is split into (chunked prefill)."),
        click.option("--reuse/--no-reuse", default=True, show_default=True,
                     help="Run a second wave of requests that hit the prefix cache."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of weights and token ids."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


@dataclass(frozen=True)
class DistCommandResult:
    """What ``cpkv run-dist`` reports (plain data; ``to_dict`` is its JSON form).

    Attributes:
        cp_size, page_size, pages_per_lane, policy, kv_mode, kv_row_width, layers, kv_storage: the run.
        max_abs_err: max |CP hidden - reference hidden| over every token of every forward (float32).
        per_rank_tokens: ``[C]`` extend tokens computed per rank, over all forwards.
        forwards: per forward: request_ids, prefix_lens, extend_lens, cache_hit_tokens, phases,
            per_rank_tokens, max_abs_err.
        unwritten_rows_intact: every KV row nobody wrote kept its guard bits.
        cache_counters: prefix-cache counters. wall_s: seconds of the run (spawn included).
    """

    cp_size: int
    page_size: int
    pages_per_lane: int
    policy: str
    kv_mode: str
    kv_row_width: int
    layers: int
    kv_storage: str
    max_abs_err: float
    per_rank_tokens: list[int]
    forwards: list[dict]
    unwritten_rows_intact: bool
    cache_counters: dict
    wall_s: float

    @property
    def ok(self) -> bool:
        """``max_abs_err <= TOLERANCE`` and no stray KV write."""
        return self.max_abs_err <= TOLERANCE and self.unwritten_rows_intact

    @classmethod
    def from_case(cls, result: CaseResult, kv_mode: str, kv_row_width: int, layers: int, wall_s: float):
        """Summarise rank 0's ``CaseResult``."""
        keys = ("request_ids", "prefix_lens", "extend_lens", "cache_hit_tokens", "phases", "per_rank_tokens",
                "max_abs_err")  # fmt: skip
        forwards = [{"forward": f.index, **{k: getattr(f, k) for k in keys}} for f in result.forwards]
        return cls(
            cp_size=result.cp_size, page_size=result.page_size, pages_per_lane=result.pages_per_lane,
            policy=result.policy, kv_mode=kv_mode, kv_row_width=kv_row_width, layers=layers,
            kv_storage=result.kv_storage, max_abs_err=float(result.max_abs_err or 0.0),
            per_rank_tokens=result.per_rank_tokens, forwards=forwards,
            unwritten_rows_intact=bool(result.unwritten_rows_intact), cache_counters=result.cache_counters,
            wall_s=wall_s,
        )  # fmt: skip

    def to_dict(self) -> dict:
        """JSON-ready dict of every field plus ``ok`` and ``tolerance``."""
        return {**asdict(self), "ok": self.ok, "tolerance": TOLERANCE}

    def summary(self) -> str:
        """Human-readable report: the run, a line per forward, per-rank tokens, the max abs error."""
        lines = [
            f"cpkv run-dist: cp_size={self.cp_size} page_size={self.page_size} pages_per_lane={self.pages_per_lane} "
            f"policy={self.policy} kv={self.kv_mode} (row {self.kv_row_width} floats) layers={self.layers} "
            f"storage={self.kv_storage}",
            f"{'fwd':>3}  {'prefix_lens':<16} {'extend_lens':<16} {'cache_hit':<16} {'phases':<10} "
            f"{'per_rank_tokens':<20} max_abs_err",
        ]
        for f in self.forwards:
            lines.append(
                f"{f['forward']:>3}  {_ints(f['prefix_lens']):<16} {_ints(f['extend_lens']):<16} "
                f"{_ints(f['cache_hit_tokens']):<16} {_ints(f['phases']):<10} {_ints(f['per_rank_tokens']):<20} "
                f"{f['max_abs_err']:.2e}"
            )
        verdict = "OK" if self.ok else "FAIL"
        lines += [
            f"per-rank tokens (all forwards): {self.per_rank_tokens}",
            f"prefix-cache hits: {self.cache_counters.get('matched_tokens', 0)} tokens",
            f"max abs error vs single-process reference: {self.max_abs_err:.3e} (tolerance {TOLERANCE:g}) {verdict}"
            + ("" if self.unwritten_rows_intact else "; a KV row outside the written slots changed"),
            f"wall time: {self.wall_s:.1f} s",
        ]
        return "\n".join(lines)


def build_case(
    cp_size: int, *, page_size: int = 16, pages_per_lane: int | None = None, policy: str | None = None,
    layers: int = 2, kv_mode: str = "mla", prefix_lens: Sequence[int] = (), extend_lens: Sequence[int] = (),
    chunks: int = 2, reuse: bool = True, seed: int = 0,
) -> DistCase:  # fmt: skip
    """The ``DistCase`` the command-line flags describe (empty lengths take the defaults).

    Raises:
        ConfigError / PlanError: a bad size, policy or length list (names the flag's value).
    """
    prefix_lens, extend_lens = list(prefix_lens), list(extend_lens)
    if not prefix_lens and not extend_lens:
        prefix_lens, extend_lens = list(DEFAULT_PREFIX_LENS), list(DEFAULT_EXTEND_LENS)
    config = CPConfig(cp_size, page_size, policy)  # validates and resolves the policy here, once
    model = TinyDecoderConfig(num_layers=check_int("layers", layers, 1), kv_mode=kv_mode, seed=seed)
    workload = make_workload(prefix_lens, extend_lens, chunks=chunks, vocab_size=model.vocab_size, seed=seed,
                             reuse=reuse)  # fmt: skip
    return DistCase(workload=workload, page_size=config.page_size, pages_per_lane=pages_per_lane,
                    policy=config.owner_policy, model=model, name="cli")  # fmt: skip


def run_dist_command(
    *, cp_size: int, page_size: int = 16, pages_per_lane: int | None = None, policy: str | None = None,
    layers: int = 2, kv_mode: str = "mla", prefix_lens: Sequence[int] = (), extend_lens: Sequence[int] = (),
    chunks: int = 2, reuse: bool = True, seed: int = 0, timeout_s: float = 120.0, backend: str | None = None,
) -> DistCommandResult:  # fmt: skip
    """Spawn ``cp_size`` ranks, run the flags' case, compare with the single-process reference.

    Args: as the flags of ``cpkv run-dist`` (lengths in tokens); ``timeout_s`` bounds each collective.

    Returns:
        ``DistCommandResult``; print ``.summary()`` or ``.to_dict()``.

    Raises:
        ConfigError / PlanError: bad flags. LaneExhausted: ``--pages-per-lane`` too small (from every rank).
        LaunchError: a rank did not finish in time (all ranks are stopped).
    """
    from .launch import run_dist

    case = build_case(cp_size, page_size=page_size, pages_per_lane=pages_per_lane, policy=policy, layers=layers,
                      kv_mode=kv_mode, prefix_lens=prefix_lens, extend_lens=extend_lens, chunks=chunks,
                      reuse=reuse, seed=seed)  # fmt: skip
    run = run_dist([case], cp_size, backend=backend, timeout_s=timeout_s)
    return DistCommandResult.from_case(run.results[0], kv_mode, case.model.kv_row_width, layers, run.wall_s)


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(int(v)) for v in values) if values else "-"


@click.command("run-dist")
@click.option("--cp-size", type=int, default=4, show_default=True,
              help="Ranks to spawn (C): gloo on 127.0.0.1, NCCL when there is a GPU per rank.")  # fmt: skip
@run_dist_options
def run_dist_cli(cp_size, page_size, pages_per_lane, policy, layers, kv_mode, prefix_lens, extend_lens, chunks,
                 reuse, seed, as_json) -> int:  # fmt: skip
    """Run CP prefill of a tiny decoder on C local processes; print max abs error vs one process.

    Each rank embeds and computes only the tokens it owns, writes their KV into its own lane of a shared
    paged buffer, reads every earlier position through the rank-major view, and the outputs are gathered
    back into flat order. Exit status 1 when the error exceeds 1e-5.
    """
    result = run_dist_command(cp_size=cp_size, page_size=page_size, pages_per_lane=pages_per_lane, policy=policy,
                              layers=layers, kv_mode=kv_mode, prefix_lens=prefix_lens, extend_lens=extend_lens,
                              chunks=chunks, reuse=reuse, seed=seed)  # fmt: skip
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.summary())
    return 0 if result.ok else 1
