"""Producer and consumer of an SGLang HiCache L3 round trip with cpkv's allocator (test_sglang_l3.py).

Each runs in a process of its own, ``python l3_roundtrip.py produce|consume JOBS_JSON`` (a job: backend,
cp_size, policy; the consumer's also the tokens), and prints one JSON line, a result per job; the producer
has exited before the consumer starts, so L3 is all they share. ``produce`` prefills a prefix after
another request, evicts everything (write-back to host; SGLang then stores the host pages in L3 under keys
carrying their owner lanes) and reports the prefix's tokens and lanes. ``consume`` builds a new cache and
a new allocator per job (nothing on device or host), prefetches the prefix from L3, loads it back and
reports the lanes its pages landed on, whether every K/V row equals the producer's, and the hook counters.

Backends: ``file`` (``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``, layer-first host layout) and
``mooncake`` (the ``MOONCAKE_*`` environment, ``page_first_direct``: SGLang's Mooncake backend refuses a
layer-first MHA host pool).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

if __name__ == "__main__":
    from cpkv.integrations.cpu_stubs import install_torchvision_stub

    install_torchvision_stub()

from hicache_engine import Engine, block_tokens  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, EvictParams  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

LAYOUT = {"file": "layer_first", "mooncake": "page_first_direct"}
PREFIX_BLOCKS = [5, 6, 7, 8, 9]
OTHER_BLOCKS = [50]
"""Block ids of the prefix and of the request before it, offset by ``1000 * cp_size`` (one prefix per C)."""


def engine(backend: str, cp_size: int, policy: str, stack: contextlib.ExitStack) -> Engine:
    """An ``Engine`` with this L3 backend, a single-rank SGLang topology entered on ``stack``."""
    stack.enter_context(get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1))
    extra = json.dumps({"prefetch_threshold": 4})
    e = Engine(cp_size, policy, rank_pages=16, layout=LAYOUT[backend], storage=backend, storage_extra=extra)
    store = getattr(e.controller.storage_backend, "store", None)  # Mooncake's client: unmount before exit
    if store is not None:
        stack.callback(store.close)
    stack.callback(e.controller._stop_storage_threads)
    return e


def wait(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise TimeoutError(f"{what} did not finish in {timeout} s")
        time.sleep(0.01)


def produce(backend: str, cp_size: int, policy: str, stack: contextlib.ExitStack) -> dict:
    """Another request keeps some lanes busy, then the prefix is prefilled, evicted and stored in L3.

    Returns ``{"tokens", "lanes", "keys_stored"}``: the prefix, its pages' owner lanes, and how many
    page keys the backend reports under their lane keys.
    """
    e = engine(backend, cp_size, policy, stack)
    base = 1000 * cp_size
    e.run([(0, block_tokens([base + b for b in OTHER_BLOCKS], e.P))], 50)
    tokens = block_tokens([base + b for b in PREFIX_BLOCKS], e.P)
    e.run([(1, tokens)], 50)
    slots = e.cache.path_device_indices(e.match(tokens).last_device_node)
    lanes = ((slots[:: e.P] // e.P) % cp_size).tolist()
    e.cache.evict(EvictParams(num_tokens=e.alloc.num_pages * e.P))  # everything: write-back, then L3

    def stored() -> bool:
        e.cache.drain_storage_control_queues()
        return not e.cache.ongoing_backup

    wait(stored, "L3 backup")
    assert e.match(tokens).device_prefix_len == 0
    return {"tokens": tokens, "lanes": lanes, "writes": [w[1].tolist() for w in e.writes]}


def consume(backend: str, cp_size: int, policy: str, tokens: list[int]) -> dict:
    """A fresh cache finds ``tokens`` in L3 and loads them back (module docstring)."""
    with contextlib.ExitStack() as stack:
        e = engine(backend, cp_size, policy, stack)
        before = e.match(tokens)
        handle = CacheRequestHandle("l3-consumer", 0)
        e.cache.prefetch_from_storage(handle, e.cache.root_node_handle(), array("q", tokens), None, None)

        def prefetched() -> bool:
            e.cache.check_hicache_events()
            return e.cache.check_prefetch_progress(handle)

        wait(prefetched, "L3 prefetch")
        host_hit = e.match(tokens).host_hit_length
        m, loaded = e.load_back(tokens)
        slots = e.cache.path_device_indices(m.last_device_node)
        return {
            "before": [before.device_prefix_len, before.host_hit_length],
            "host_hit": host_hit,
            "loaded": loaded,
            "device_prefix": m.device_prefix_len,
            "lanes": ((slots[:: e.P] // e.P) % cp_size).tolist(),
            "rows_equal": e.rows_equal(tokens, slots),
            "counts": e.controller.cpkv_lanes.counts,
        }


if __name__ == "__main__":
    from hicache_engine import install

    from cpkv.integrations import sglang_hicache

    role, jobs = sys.argv[1], json.loads(sys.argv[2])
    # cpkv selected for its hooks. Set after SGLang resolved its platform: each job builds cpkv's allocator
    # for its own C (a launch would set CPKV_CP_SIZE too, and SGLang's platform hook would build it).
    os.environ["SGLANG_PLATFORM"] = "cpkv"
    install(sglang_hicache.register)
    with contextlib.ExitStack() as stack:
        if role == "produce":
            results = [produce(j["backend"], j["cp_size"], j["policy"], stack) for j in jobs]
        else:
            results = [consume(j["backend"], j["cp_size"], j["policy"], j["tokens"]) for j in jobs]
    print("L3RESULT " + json.dumps(results), flush=True)
    os._exit(0)  # SGLang's storage threads do not join; the result is out
