"""Every command's flag set is pinned (after torchtitan's test_no_new_cli_options): a flag added, renamed
or removed fails here until this list, the README and docs are updated with it."""

import click
import pytest

from cpkv.cli import app
from cpkv.executor.__main__ import command as torchrun_main

pytestmark = pytest.mark.unit

FLAGS = {
    "plan": [
        "--batch",
        "--cp-size",
        "--cp-strategy",
        "--extend-len",
        "--head-owner",
        "--json",
        "--page-size",
        "--policy",
        "--prefix-len",
        "--req-index",
    ],
    "simulate": [
        "--backend",
        "--chunk-size",
        "--colocated-decode",
        "--cost-model",
        "--cp-size",
        "--cp-strategy",
        "--duration",
        "--ep-size",
        "--gpu",
        "--host-pages-per-lane",
        "--kv-storage",
        "--logits-budget-mb",
        "--max-batch-tokens",
        "--max-requests",
        "--model",
        "--no-progress",
        "--out",
        "--page-size",
        "--pages-per-lane",
        "--policy",
        "--rate-scale",
        "--seed",
        "--spec-accept-rate",
        "--spec-draft-tokens",
        "--start",
        "--trace",
        "--ttft-slo-ms",
        "--workload",
    ],
    "sweep": [
        "--executor",
        "--max-points",
        "--no-progress",
        "--out",
        "--ray-address",
        "--retry-failed",
        "--workers",
        "grid_file",
    ],
    "run-dist": [
        "--attention",
        "--chunks",
        "--cp-size",
        "--cp-strategy",
        "--decode-steps",
        "--extend-len",
        "--index-heads",
        "--index-topk",
        "--json",
        "--kv-access",
        "--kv-mode",
        "--layers",
        "--no-reuse",
        "--page-size",
        "--pages-per-lane",
        "--policy",
        "--prefix-len",
        "--reuse",
        "--seed",
    ],
}


def _flags(cmd: click.Command) -> list[str]:
    return sorted(o for p in cmd.params for o in (*p.opts, *p.secondary_opts))


def test_each_command_has_exactly_its_pinned_flags():
    ctx = click.Context(app)
    assert app.list_commands(ctx) == sorted(FLAGS)
    for name, flags in FLAGS.items():
        assert _flags(app.get_command(ctx, name)) == flags, name
    assert _flags(app) == ["--version"]


def test_the_torchrun_entry_takes_run_dist_flags_but_cp_size_plus_timeout():
    want = sorted({*FLAGS["run-dist"]} - {"--cp-size"} | {"--timeout"})
    assert _flags(torchrun_main) == want
