"""``python -m cpkv.executor`` (torchrun's entry) answers misuse as ``cpkv run-dist`` does: one line per
rank on stderr, exit 2, before any rank joins a world."""

import subprocess
import sys
import time

import pytest

from cpkv.executor.__main__ import main

pytestmark = pytest.mark.unit

WORLD = {
    "RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29531",
}
VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")


@pytest.mark.parametrize(
    ("env", "argv", "line"),
    [
        (
            {},
            [],
            "cpkv.executor: rank ?: error: RANK and WORLD_SIZE not set: python -m cpkv.executor is one rank "
            "of a torchrun world",
        ),
        ({"RANK": "0"}, [], "cpkv.executor: rank 0: error: WORLD_SIZE not set"),
        (
            {**WORLD, "WORLD_SIZE": "abc"},
            [],
            "cpkv.executor: rank 0: error: WORLD_SIZE='abc' is not an integer",
        ),
        ({**WORLD, "WORLD_SIZE": "0"}, [], "cpkv.executor: rank 0: error: WORLD_SIZE=0 must be >= 1"),
        (
            {**WORLD, "RANK": "5"},
            [],
            "cpkv.executor: rank 5: error: RANK=5 is out of range for WORLD_SIZE=2 (ranks 0 .. 1)",
        ),
        ({**WORLD, "RANK": "-1"}, [], "cpkv.executor: rank -1: error: RANK=-1 must be >= 0"),
        ({**WORLD, "LOCAL_RANK": "x"}, [], "cpkv.executor: rank 0: error: LOCAL_RANK='x' is not an integer"),
        (
            {k: v for k, v in WORLD.items() if k != "MASTER_ADDR"},
            [],
            "cpkv.executor: rank 0: error: MASTER_ADDR not set",
        ),
        (
            {**WORLD, "MASTER_PORT": "70000"},
            [],
            "cpkv.executor: rank 0: error: MASTER_PORT=70000 is not a port",
        ),
        (WORLD, ["--bogus"], "cpkv.executor: rank 0: error: No such option '--bogus'"),
        (WORLD, ["--page-size", "x"], "cpkv.executor: rank 0: error: Invalid value for '--page-size'"),
        (WORLD, ["--page-size", "0"], "cpkv.executor: rank 0: error: page_size must be >= 1, got 0"),
        (
            WORLD,
            ["--pages-per-lane", "9,10,10"],
            "cpkv.executor: rank 0: error: --pages-per-lane has 3 entries, cp_size=2 needs 2",
        ),
        (WORLD, ["--timeout", "0"], "cpkv.executor: rank 0: error: --timeout 0.0 must be > 0 seconds"),
    ],
)
def test_misuse_is_one_line_and_exit_2(env, argv, line, monkeypatch, capsys):
    for key in VARS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert cap.out == "" and len(err) == 1, cap.err
    assert err[0].startswith(line), err[0]


def test_outside_torchrun_the_module_says_one_line_at_once():
    env = {k: v for k, v in __import__("os").environ.items() if k not in VARS}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cpkv.executor", "--page-size", "16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "cpkv.executor: rank ?: error: RANK and WORLD_SIZE not set: python -m cpkv.executor is one rank of a "
        "torchrun world (torchrun --nproc-per-node C -m cpkv.executor ...); to spawn the ranks here, use cpkv "
        "run-dist --cp-size C"
    ]
    assert time.monotonic() - t0 < 60
