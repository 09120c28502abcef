"""HiCache load-back on the recorded owner lanes through SGLang 0.5.23's own classes (SPEC C-RELOAD).

SGLang's ``UnifiedRadixCache`` + ``HybridCacheController`` (device "cpu", ``io_backend="direct"``, write-back)
over cpkv's allocator, with the hooks of ``cpkv.integrations.sglang_hicache`` applied through a
``HookRegistry`` (no SGLang file patched) and undone after each test. The oracle is a spy on the
controller (``hicache_engine.Engine``): the lane of the device page each write-back copied, against the
lane of the row each load-back filled; and every cached row read back names its token.
"""

import numpy as np
import pytest
import torch

pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from hicache_engine import Engine, block_tokens, install  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402

from cpkv.integrations import sglang_hicache  # noqa: E402
from cpkv.sim.scenarios import tiny_chunks_reload_workload  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.clause("C-RELOAD")]


@pytest.fixture
def hooks(monkeypatch):
    """cpkv's hooks applied and selected (``SGLANG_PLATFORM=cpkv``), undone after the test."""
    monkeypatch.setenv("SGLANG_PLATFORM", "cpkv")
    undo = install(sglang_hicache.register)
    yield
    undo()


@pytest.fixture
def stock(monkeypatch):
    """SGLang's own load-back: only the CPU stand-ins, and cpkv not selected (were cpkv's hooks applied
    by an earlier test of the session, they pass through)."""
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    undo = install(lambda registry: ())
    yield
    undo()


def chain(engine: Engine, head_pages: int, tail_pages: int) -> tuple[list[int], list[int]]:
    """Prefill a head request, then its extension by ``tail_pages`` pages; evict the extension to host.
    Returns (tokens of the extension request, device lanes of its tail pages before eviction)."""
    head = block_tokens(range(head_pages), engine.P)
    full = head + block_tokens(range(100, 100 + tail_pages), engine.P)
    engine.run([(0, head)], 50)
    engine.run([(1, full)], 50)
    node = engine.match(full).last_device_node
    tail = engine.cache.path_device_indices(node)[len(head) :: engine.P]
    lanes = ((tail // engine.P) % engine.C).tolist()
    tokens = tail_pages * engine.P  # the LRU leaf: the extension, written back to host first
    assert engine.cache.evict(EvictParams(num_tokens=tokens)).num_tokens_evicted == tokens
    return full, lanes


def test_stock_load_back_loses_the_owner_lanes(stock):
    """The bug, measured: SGLang's ``alloc(n)`` puts a reloaded chain on fresh lanes (C=4, rotation)."""
    engine = Engine(4, "rotation", rank_pages=8)
    full, recorded = chain(engine, 2, 3)
    m, loaded = engine.load_back(full)
    assert loaded is True and m.device_prefix_len == len(full)
    assert recorded == [2, 3, 0]
    assert engine.loads[0][1].tolist() == [0, 1, 2]  # not [2, 3, 0]: owner != compute for every page


@pytest.mark.parametrize("cp_size", [2, 3, 4, 8])
@pytest.mark.parametrize("policy", ["rotation", "balanced", "legacy"])
def test_load_back_replays_the_recorded_lanes(hooks, cp_size, policy):
    engine = Engine(cp_size, policy, rank_pages=16)  # legacy puts all 2 + C + 1 pages on lane 0
    full, recorded = chain(engine, 2, cp_size + 1)
    host_pages, written_lanes = engine.writes[-1]
    assert written_lanes.tolist() == recorded  # write-back recorded each page's owner lane
    rows = torch.from_numpy((host_pages[:, None] * engine.P + np.arange(engine.P)).reshape(-1))
    assert engine.controller.cpkv_lanes.owners(rows).tolist() == recorded
    m, loaded = engine.load_back(full)
    assert loaded is True and m.device_prefix_len == len(full)
    assert engine.loads[-1][1].tolist() == recorded
    slots = engine.cache.path_device_indices(m.last_device_node)
    assert engine.rows_equal(full, slots)
    assert engine.controller.cpkv_lanes.counts["load_back_pages"] == cp_size + 1


@pytest.mark.parametrize("cp_size", [2, 4, 8])
def test_a_short_recorded_lane_is_recomputed_never_waited_on(hooks, cp_size):
    """Every free page of the recorded lane held by a running request: the follow-up's load-back fails at
    once, counts once, takes nothing, and the request recomputes that page on a lane with room
    (``balanced`` picks it) and finishes while the lane stays full."""
    engine = Engine(cp_size, "balanced", rank_pages=4)
    full, recorded = chain(engine, 1, 1)
    lane = recorded[0]
    held = engine.alloc.lanes.alloc_pages(np.full(int(engine.alloc.lanes.free_pages_per_lane()[lane]), lane))
    before = engine.alloc.aggregate_free_size()
    engine.run([(2, full)], 20)
    assert engine.finished[-1] == 2 and engine.loads == [] and engine.waits == 0
    counts = engine.controller.cpkv_lanes.counts
    assert counts["load_back_owner_lane_capacity_failed"] == 1 and counts["load_back_failed_pages"] == 1
    m = engine.match(full)
    assert m.device_prefix_len == len(full)
    tail = int(engine.cache.path_device_indices(m.last_device_node)[-1])
    assert (tail // engine.P) % cp_size != lane  # recomputed elsewhere
    assert engine.alloc.aggregate_free_size() == before - engine.P  # only the recomputed page was taken
    engine.alloc.lanes.free(held)


# Measured (this test's sizes: 16 conversations, 3 turns, one-page chunks, 4 running, 128 device pages in all):
# legacy's owner-lane load-back failures (events, pages) and finished requests, per cp_size.
LEGACY = {2: (1, 16, 48), 3: (3, 32, 16), 4: (7, 82, 21), 8: (5, 58, 16)}


@pytest.mark.parametrize("cp_size", [2, 3, 4, 8])
@pytest.mark.parametrize("policy", ["legacy", "rotation", "balanced"])
def test_tiny_chunks_reload_incident(hooks, cp_size, policy):
    """The seed's incident through SGLang's classes (cpkv's ``tiny-chunks-reload`` workload, scaled down):
    first turns one at a time, then two bursts of follow-ups whose prefixes were written back and evicted.
    ``legacy`` records every page on lane 0, the burst's chunks fill it, and load-backs fail on their
    lane (the seed's counter); ``rotation`` and ``balanced`` load every prefix back on its recorded lanes,
    with no failure, and every request finishes."""
    requests = tiny_chunks_reload_workload(16, 0, turns=3)
    engine = Engine(cp_size, policy, rank_pages=128 // cp_size, max_running=4)
    for r in requests:
        if r.arrival_ms < 120_000:
            engine.run([(r.req_id, block_tokens(r.hash_ids, engine.P))], 400)
    for turn in (1, 2):
        t0 = 120_000 + (turn - 1) * 30_000
        burst = [
            (r.req_id, block_tokens(r.hash_ids, engine.P))
            for r in requests
            if t0 <= r.arrival_ms < t0 + 30_000
        ]
        engine.run(burst, 400)
    counts = engine.controller.cpkv_lanes.counts
    for host_pages, lanes in engine.loads:  # every loaded page on the lane its write-back recorded
        assert lanes.tolist() == [engine.recorded_lane(int(h)) for h in host_pages]
    assert counts["load_back_pages"] == sum(lanes.size for _, lanes in engine.loads) > 0
    failed = (
        counts["load_back_owner_lane_capacity_failed"],
        counts["load_back_failed_pages"],
        len(engine.finished),
    )
    if policy == "legacy":
        assert failed == LEGACY[cp_size]
    else:
        assert failed == (0, 0, len(requests)) and engine.waits == 0
        P, tree = engine.P, engine.cache  # nothing running: tree pages + free pages are the pool
        assert tree.evictable_size() + engine.alloc.aggregate_free_size() == engine.alloc.num_pages * P
