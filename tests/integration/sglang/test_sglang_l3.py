"""SGLang 0.5.23 HiCache L3 with cpkv's owner lanes: the ``file`` backend and a real ``mooncake_master``.

A producer (this process) prefills a prefix, evicts it to host, and SGLang stores its pages in L3 under
keys that carry each page's owner lane (``cpkv.integrations.sglang_hicache``). A consumer started as a
fresh process (``l3_roundtrip.py``: new cache, new allocator) finds the prefix in L3, prefetches it to
host and loads it back: every page on the lane the producer recorded, every K/V row equal. SGLang
itself refuses L3 with its own KV sharding (``--enable-kv-cache-sharding``); cpkv's lanes ride in the keys.

Mooncake: ``mooncake_master`` from ``mooncake-transfer-engine-non-cuda`` (which links ``libibverbs.so.1``:
Debian's ``libibverbs1``, installed by ``make test-sglang``), started here on 127.0.0.1 with its HTTP
metadata server on free ports, the TCP transport, and stopped at the end. Never a mock.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from hicache_engine import install  # noqa: E402
from l3_roundtrip import produce  # noqa: E402

from cpkv.integrations import sglang_hicache  # noqa: E402

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


@pytest.fixture(scope="module")
def mooncake_master(tmp_path_factory):
    """A real ``mooncake_master`` on 127.0.0.1 (RPC, HTTP metadata, metrics on free ports); yields the
    client environment (TCP transport), stops the master at the end."""
    binary = Path(sys.executable).parent / "mooncake_master"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: install mooncake-transfer-engine-non-cuda (make test-sglang)")
    rpc, http, metrics = free_port(), free_port(), free_port()
    log = (tmp_path_factory.mktemp("mooncake") / "master.log").open("w")
    proc = subprocess.Popen(
        [str(binary), f"--rpc_port={rpc}", "--rpc_address=127.0.0.1", "--enable_http_metadata_server=true",
         "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}", f"--metrics_port={metrics}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_port(rpc, proc)
        wait_for_port(http, proc)
        yield {
            "MOONCAKE_MASTER": f"127.0.0.1:{rpc}",
            "MOONCAKE_PROTOCOL": "tcp",
            "MOONCAKE_DEVICE": "",
            "MOONCAKE_TE_META_DATA_SERVER": f"http://127.0.0.1:{http}/metadata",
            "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
            "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(64 << 20),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def backend_env(request, tmp_path, monkeypatch):
    """``(backend, env)``: the file backend's directory, or the Mooncake master's client environment, set
    in this process too (the producer), with ``SGLANG_PLATFORM=cpkv``."""
    backend = request.param
    env = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tmp_path / "l3")} if backend == "file" else \
        request.getfixturevalue("mooncake_master")  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SGLANG_PLATFORM", "cpkv")  # cpkv selected: its hooks act (the consumer selects it too)
    return backend, env


def consumer(env: dict, jobs: list[dict]) -> list[dict]:
    """Run ``l3_roundtrip.py consume`` in a fresh process; its JSON results, one per job."""
    environ = {k: v for k, v in os.environ.items() if k != "SGLANG_PLATFORM"} | env  # the consumer selects cpkv
    run = subprocess.run([sys.executable, str(HERE / "l3_roundtrip.py"), "consume", json.dumps(jobs)],
                         env=environ, capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("L3RESULT ")]
    assert run.returncode == 0 and lines, f"consumer failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("L3RESULT "))


CP_SIZES = (2, 3, 4, 8)


@pytest.mark.parametrize("backend_env", ["file", "mooncake"], indirect=True)
def test_l3_prefix_loads_back_on_its_lanes_in_a_fresh_process(backend_env):
    """At each C in CP_SIZES a producer (kept alive: Mooncake serves from its segment) stores a prefix;
    one fresh consumer process loads each back with a new cache and a new allocator."""
    backend, env = backend_env
    undo = install(sglang_hicache.register)
    try:
        with contextlib.ExitStack() as stack:
            made = {C: produce(backend, C, "balanced", stack) for C in CP_SIZES}
            for C, m in made.items():
                assert m["lanes"][0] != 0, C  # balanced starts the prefix off lane 0, where the other page is
            if backend == "file":  # one page file a written-back page, its key naming the page's lane
                names = os.listdir(env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"])
                written = sorted(lane for m in made.values() for w in m["writes"] for lane in w)
                assert sorted(int(n.split("_lane")[1].split("_")[0]) for n in names) == written
            jobs = [{"backend": backend, "cp_size": C, "policy": "balanced", "tokens": m["tokens"]}
                    for C, m in made.items()]  # fmt: skip
            results = consumer(env, jobs)
    finally:
        undo()
    for (C, m), got in zip(made.items(), results, strict=True):
        n = len(m["lanes"])
        assert got["before"] == [0, 0], C  # a fresh process: nothing on device or host
        assert (got["host_hit"], got["loaded"], got["device_prefix"]) == (n * 4, True, n * 4), C
        assert got["lanes"] == m["lanes"], C  # the recorded owner lanes, not a fresh chain's
        assert got["rows_equal"] is True, C
        counts = got["counts"]
        assert (counts["l3_pages_read"], counts["load_back_pages"]) == (n, n), C
        assert counts["load_back_owner_lane_capacity_failed"] == 0, C
