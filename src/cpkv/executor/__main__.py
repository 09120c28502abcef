"""torchrun entry: ``torchrun --nproc-per-node C -m cpkv.executor [flags of cpkv run-dist but --cp-size]``.

Each process joins the torchrun world (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``
from the environment; torchrun's default master address is 127.0.0.1), runs the case the flags describe
and rank 0 prints the summary. C is the world size.

Misuse answers as ``cpkv run-dist`` does: one line on stderr per rank, ``cpkv.executor: rank R: error:
...``, and exit 2, before any rank joins the world: no torchrun variables, a ``WORLD_SIZE`` / ``RANK`` /
``LOCAL_RANK`` / ``MASTER_PORT`` that is not an integer in range, unknown or bad flags, lanes that do not
match the world. A peer that never arrives fails the rendezvous after ``--timeout`` s (one line, exit 2);
torchrun then adds its own report of the failed ranks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping

import click

from ..errors import ConfigError, CpkvError
from .cli_entry import DistCommandResult, build_case, run_dist_options
from .launch import cases_target, run_rank

PROG = "cpkv.executor"


def torchrun_env(environ: Mapping[str, str]) -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's variables.

    Raises:
        ConfigError: ``RANK`` / ``WORLD_SIZE`` missing (not under torchrun), a variable that is not an
            integer in range (``WORLD_SIZE >= 1``, ``0 <= RANK < WORLD_SIZE``, ``LOCAL_RANK >= 0``,
            ``MASTER_PORT`` in ``[1, 65535]``), or ``MASTER_ADDR`` / ``MASTER_PORT`` missing; names the value.
    """
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in environ]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} not set: python -m {PROG} is one rank of a torchrun world (torchrun "
            f"--nproc-per-node C -m {PROG} ...); to spawn the ranks here, use cpkv run-dist --cp-size C"
        )
    world = _env_int(environ, "WORLD_SIZE", 1)
    rank = _env_int(environ, "RANK", 0)
    if rank >= world:
        raise ConfigError(f"RANK={rank} is out of range for WORLD_SIZE={world} (ranks 0 .. {world - 1})")
    local_rank = _env_int(environ, "LOCAL_RANK", 0) if "LOCAL_RANK" in environ else rank
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if not environ.get(key):
            raise ConfigError(f"{key} not set: torchrun sets it (the rendezvous address of rank 0)")
    port = _env_int(environ, "MASTER_PORT", 1)
    if port > 65535:
        raise ConfigError(f"MASTER_PORT={port} is not a port (1 .. 65535)")
    return rank, world, local_rank


def _env_int(environ: Mapping[str, str], key: str, minimum: int) -> int:
    text = environ[key]
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{key}={text!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{key}={value} must be >= {minimum}")
    return value


@click.command(help="One rank of a torchrun world running cpkv's CP prefill reference (C = WORLD_SIZE).")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=120.0,
    show_default=True,
    help="Limit of each collective (and of the rendezvous), in seconds.",
)
@run_dist_options
def command(timeout_s, as_json, **flags) -> int:
    """Run one rank; rank 0 prints the summary (or JSON) and every rank exits 0 when the run is OK."""
    import torch.distributed as dist

    rank, world, local_rank = torchrun_env(os.environ)
    if not timeout_s > 0:
        raise ConfigError(f"--timeout {timeout_s} must be > 0 seconds")
    case = build_case(world, **flags)
    t0 = time.monotonic()
    try:
        results = run_rank(
            rank,
            world,
            cases_target,
            [case],
            None,
            init_method="env://",
            timeout_s=timeout_s,
            local_rank=local_rank,
        )
    except dist.DistError as e:  # the rendezvous or a collective failed: a peer missing, or gone
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"the torchrun world of {world} did not run within --timeout {timeout_s:g} s: {first}"
        ) from None
    if rank != 0:
        return 0
    result = DistCommandResult.from_case(results[0], case.model, time.monotonic() - t0)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.summary())
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Console entry of one rank: misuse and typed errors print one line (``cpkv.executor: rank R: error:
    ...``) and return 2; Ctrl-C returns 130 (``cpkv.executor: rank R: aborted``)."""
    who = f"{PROG}: rank {os.environ.get('RANK', '?')}"
    try:
        with command.make_context(PROG, list(sys.argv[1:] if argv is None else argv)) as ctx:
            rv = command.invoke(ctx)
    except click.exceptions.Exit as e:  # --help
        return e.exit_code
    except click.exceptions.UsageError as e:
        print(f"{who}: error: {e.format_message()}", file=sys.stderr)
        return 2
    except CpkvError as e:
        print(f"{who}: error: {e}", file=sys.stderr)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        print(f"{who}: aborted", file=sys.stderr)
        return 130
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
