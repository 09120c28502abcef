"""Ctrl-C during ``cpkv run-dist``: exit 130, one line on stderr, no rank left running, nothing left in
/dev/shm. A terminal's Ctrl-C signals the whole foreground process group, so the test starts the command
in a session of its own and sends SIGINT to that group, at a moment when the ranks are running."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpkv.executor.kv_buffer import FILE_PREFIX, shm_dir

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not Path("/proc/self/maps").exists() or os.name != "posix", reason="needs Linux /proc"
    ),
]


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc/<pid>/stat)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def maps_shared_kv(pid: int) -> bool:
    """Whether process ``pid`` has mapped a shared KV file (so it is past start-up, inside the run)."""
    try:
        return FILE_PREFIX in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_exits_130_with_one_line_and_no_leftovers():
    cmd = [
        sys.executable,
        "-m",
        "cpkv.cli",
        "run-dist",
        "--cp-size",
        "2",
        "--page-size",
        "16",
        "--prefix-len",
        "0",
        "--extend-len",
        "3000",
        "--chunks",
        "1",
        "--no-reuse",
    ]
    proc = subprocess.Popen(  # SIGINT back to its default in the child: a runner started in the background
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # ignores it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # and the child would inherit that
    )
    try:
        ranks: list[int] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = children(proc.pid)
            if sum(maps_shared_kv(p) for p in ranks) == 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None and ranks, "the run ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err == "cpkv: aborted\n" and out == ""
    assert not list(shm_dir().glob(f"{FILE_PREFIX}{proc.pid}-*"))
    end = time.monotonic() + 10
    while any(alive(p) for p in ranks) and time.monotonic() < end:
        time.sleep(0.05)
    assert not [p for p in ranks if alive(p)], "a rank outlived the command"
