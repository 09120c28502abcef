"""torchrun entry: ``torchrun --nproc-per-node C -m cpkv.executor [flags of cpkv run-dist but --cp-size]``.

Each process joins the torchrun world (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``
from the environment; torchrun's default master address is 127.0.0.1), runs the case the flags describe
and rank 0 prints the summary. C is the world size.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click

from .cli_entry import DistCommandResult, build_case, run_dist_options
from .launch import cases_target, run_rank


@click.command(help="One rank of a torchrun world running cpkv's CP prefill reference (C = WORLD_SIZE).")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Limit of each collective, in seconds.")  # fmt: skip
@run_dist_options
def main(timeout_s, as_json, **flags) -> int:
    """Run one rank; rank 0 prints the summary (or JSON) and every rank exits 0 when the run is OK."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    case = build_case(world, **flags)
    t0 = time.monotonic()
    results = run_rank(rank, world, cases_target, [case], None, init_method="env://", timeout_s=timeout_s,
                       local_rank=local_rank)  # fmt: skip
    if rank != 0:
        return 0
    result = DistCommandResult.from_case(results[0], case.model, time.monotonic() - t0)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main.main(standalone_mode=False) or 0)
