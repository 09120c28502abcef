"""``cpkv run-dist`` (spawns its ranks) and ``torchrun -m cpkv.executor``: max abs error and per-rank tokens."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cpkv.executor.cli_entry import TOLERANCE, run_dist_cli

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

ARGS = ["--page-size", "16", "--prefix-len", "0", "--extend-len", "9", "--prefix-len", "21",
        "--extend-len", "40", "--chunks", "3", "--seed", "1"]  # fmt: skip


def test_run_dist_command_json():
    res = CliRunner().invoke(run_dist_cli, ["--cp-size", "2", "--json", *ARGS])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ok"] is True and out["max_abs_err"] <= TOLERANCE == out["tolerance"]
    assert (out["cp_size"], out["page_size"], out["kv_mode"], out["kv_row_width"]) == (2, 16, "mla", 576)
    assert out["policy"] == os.environ.get("CPKV_OWNER_POLICY", "balanced")  # the default policy (C-PHASE)
    # Per-rank tokens add up to every token computed: wave 1 (21 + 9 + 40) and the reuse wave.
    fw = out["forwards"]
    assert sum(out["per_rank_tokens"]) == sum(sum(f["extend_lens"]) for f in fw)
    assert sum(sum(f["extend_lens"]) for f in fw[:4]) == 21 + 9 + 40
    assert [f["per_rank_tokens"] for f in fw] and all(len(f["per_rank_tokens"]) == 2 for f in fw)


def test_run_dist_command_text_and_bad_flags():
    res = CliRunner().invoke(
        run_dist_cli, ["--cp-size", "1", "--policy", "legacy", "--kv-mode", "mha", *ARGS]
    )
    assert res.exit_code == 0, res.output
    assert "max abs error vs single-process reference" in res.output and "OK" in res.output
    assert "per-rank tokens (all forwards): [" in res.output
    bad = CliRunner().invoke(run_dist_cli, ["--cp-size", "2", "--prefix-len", "0"])
    assert isinstance(bad.exception, ValueError) and "one prefix_len per extend_len" in str(bad.exception)


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun"
)
def test_torchrun_entry():
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "cpkv.executor",
           "--json", "--kv-mode", "mha", "--no-reuse", *ARGS]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert out["cp_size"] == 2 and out["ok"] is True
    assert sum(out["per_rank_tokens"]) == 21 + 9 + 40
