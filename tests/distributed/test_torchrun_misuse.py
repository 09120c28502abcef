"""``torchrun -m cpkv.executor`` misused: each rank says one line and exits 2, torchrun adds its own report;
a peer that never arrives fails the rendezvous after ``--timeout``."""

import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, **extra}


def test_an_unknown_flag_under_torchrun_is_one_line_per_rank_exit_2():
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "cpkv.executor",
        "--bogus",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=_env())
    ours = [line for line in proc.stderr.splitlines() if line.startswith("cpkv.executor: ")]
    # torchrun stops the other rank once one fails: each rank that got to say something said this one line
    assert ours and set(ours) <= {
        f"cpkv.executor: rank {r}: error: No such option '--bogus'." for r in (0, 1)
    }
    assert len(ours) == len(set(ours)), proc.stderr
    assert (
        "click" not in proc.stderr and "UsageError" not in proc.stderr
    )  # no click traceback inside torchrun's
    assert proc.returncode != 0 and "exitcode  : 2" in proc.stderr


def test_a_missing_peer_fails_after_the_timeout_in_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cpkv.executor", "--timeout", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 2 and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "cpkv.executor: rank 1: error: the torchrun world of 2 did not run within --timeout 3 s"
    )
    assert 3 <= took < 60
