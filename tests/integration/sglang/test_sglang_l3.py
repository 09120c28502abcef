"""SGLang 0.5.23 HiCache L3 with cpkv's owner lanes: the ``file`` backend and a real ``mooncake_master``.

A producer process prefills a prefix, evicts it to host, and SGLang stores its pages in L3 under keys that
carry each page's owner lane (``cpkv.integrations.sglang_hicache``); it exits. A consumer started after it
as a fresh process (``l3_roundtrip.py``: new cache, new allocator) finds the prefix in L3, prefetches it
to host and loads it back: every page on the lane the producer recorded, every K/V row equal. SGLang
itself refuses L3 with its own KV sharding (``--enable-kv-cache-sharding``); cpkv's lanes ride in the keys.

Mooncake: ``mooncake_master`` from ``mooncake-transfer-engine-non-cuda`` (which links ``libibverbs.so.1``:
Debian's ``libibverbs1``, installed by ``make test-sglang``) with its HTTP metadata server, and a
``mooncake_client`` store process holding the memory (64 MiB), both started here on 127.0.0.1 on free
ports with the TCP transport and stopped at the end; the engines mount no memory of their own, so the
stored pages outlive the producer. Never a mock.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

pytestmark = [pytest.mark.sglang, pytest.mark.clause("C-RELOAD")]
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mooncake_master exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"mooncake_master did not listen on 127.0.0.1:{port} within {timeout} s")


def start(cmd: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def mooncake_master(tmp_path_factory):
    """A real ``mooncake_master`` (RPC, HTTP metadata, metrics on free ports of 127.0.0.1) and a
    ``mooncake_client`` store process holding the memory; yields the engines' client environment (TCP
    transport, no memory of their own), stops both at the end."""
    bin_dir = Path(sys.executable).parent
    for name in ("mooncake_master", "mooncake_client"):
        if not (bin_dir / name).exists():
            pytest.fail(
                f"{bin_dir / name} is missing: install mooncake-transfer-engine-non-cuda (make test-sglang)"
            )
    rpc, http, metrics, store = free_port(), free_port(), free_port(), free_port()
    logs = tmp_path_factory.mktemp("mooncake")
    with (logs / "master.log").open("w") as master_log, (logs / "store.log").open("w") as store_log:
        master = start(
            [
                str(bin_dir / "mooncake_master"),
                f"--rpc_port={rpc}",
                "--rpc_address=127.0.0.1",
                "--enable_http_metadata_server=true",
                "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={http}",
                f"--metrics_port={metrics}",
            ],
            master_log,
        )
        procs = [master]
        try:
            wait_for_port(rpc, master)
            wait_for_port(http, master)
            metadata = f"http://127.0.0.1:{http}/metadata"
            holder = start(
                [
                    str(bin_dir / "mooncake_client"),
                    f"--master_server_address=127.0.0.1:{rpc}",
                    f"--metadata_server={metadata}",
                    "--host=127.0.0.1",
                    f"--port={store}",
                    "--global_segment_size=64 MB",
                    "--protocol=tcp",
                ],
                store_log,
            )
            procs.append(holder)
            wait_for_port(store, holder)
            yield {
                "MOONCAKE_MASTER": f"127.0.0.1:{rpc}",
                "MOONCAKE_PROTOCOL": "tcp",
                "MOONCAKE_DEVICE": "",
                "MOONCAKE_TE_META_DATA_SERVER": metadata,
                "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
                "MOONCAKE_GLOBAL_SEGMENT_SIZE": "0",  # the pages live in the store process's memory
            }
        finally:
            for proc in reversed(procs):
                stop(proc)


@pytest.fixture
def backend_env(request, tmp_path):
    """``(backend, env)``: the file backend's directory, or the Mooncake client environment."""
    if request.param == "file":
        return "file", {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tmp_path / "l3")}
    return "mooncake", request.getfixturevalue("mooncake_master")


def run_jobs(role: str, env: dict, jobs: list[dict]) -> list[dict]:
    """Run ``l3_roundtrip.py ROLE`` in a process of its own under ``env``; its JSON results, one per job."""
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CPKV_", "MOONCAKE_"))
    } | env
    run = subprocess.run(
        [sys.executable, str(HERE / "l3_roundtrip.py"), role, json.dumps(jobs)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("L3RESULT ")]
    assert run.returncode == 0 and lines, (
        f"{role} failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    )
    return json.loads(lines[-1].removeprefix("L3RESULT "))


CP_SIZES = (2, 3, 4, 8)


@pytest.mark.parametrize("backend_env", ["file", "mooncake"], indirect=True)
def test_l3_prefix_loads_back_on_its_lanes_in_a_fresh_process(backend_env):
    """At each C in CP_SIZES a producer process stores a prefix in L3 and exits; a consumer process then
    loads each prefix back with a new cache and a new allocator."""
    backend, env = backend_env
    made = run_jobs(
        "produce", env, [{"backend": backend, "cp_size": C, "policy": "balanced"} for C in CP_SIZES]
    )
    for C, m in zip(CP_SIZES, made, strict=True):
        assert m["lanes"][0] != 0, C  # balanced starts the prefix off lane 0, where the other page is
    if backend == "file":  # one page file a written-back page, its key naming the page's lane
        names = os.listdir(env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"])
        written = sorted(lane for m in made for w in m["writes"] for lane in w)
        assert sorted(int(n.split("_lane")[1].split("_")[0]) for n in names) == written
    jobs = [
        {"backend": backend, "cp_size": C, "policy": "balanced", "tokens": m["tokens"]}
        for C, m in zip(CP_SIZES, made, strict=True)
    ]
    for C, m, got in zip(CP_SIZES, made, run_jobs("consume", env, jobs), strict=True):
        n = len(m["lanes"])
        assert got["before"] == [0, 0], C  # a fresh process: nothing on device or host
        assert (got["host_hit"], got["loaded"], got["device_prefix"]) == (n * 4, True, n * 4), C
        assert got["lanes"] == m["lanes"], C  # the recorded owner lanes, not a fresh chain's
        assert got["rows_equal"] is True, C
        counts = got["counts"]
        assert (counts["l3_pages_read"], counts["load_back_pages"]) == (n, n), C
        assert counts["load_back_owner_lane_capacity_failed"] == 0, C
