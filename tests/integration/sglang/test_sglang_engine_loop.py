"""SGLang 0.5.23's scheduler components over the Mooncake trace at C=4, on CPU.

``cpkv.integrations.sglang_engine_loop.EngineLoop`` drives ``PrefillAdder`` admission, ``UnifiedRadixCache``
with HiCache (``io_backend="direct"``) and an L3 ``file`` store, cpkv's allocator from SGLang's platform hook
with cpkv's plugins installed (scheduler hooks, HiCache owner replay), and SGLang's invariant checker after
every step, over the first 300 requests of ``../shared/traces/mooncake_conversation_trace.jsonl`` and then the
same 300 in reverse order (the trace reuses a prefix one request later, so reverse order is what makes
HiCache load pages back). Token scale: a 512-token trace block is 4 tokens (one page of P=4), 33,514
prompt tokens a pass; each rank's pool holds 96 pages. Every step checks (``EngineLoop.checks``): no
invariant violation, no slot outside its rank's buffer, the rows read back through ``read_slots`` equal
the rows written, every device page of the tree holding its tokens' K/V rows stamped with the lane that
computed them (so a page loaded back onto another lane fails). About 50 s here for the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

TRACE = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
PROMPT_TOKENS = 33514


@pytest.fixture(scope="module")
def m():
    if not TRACE.exists():
        pytest.skip(f"no trace at {TRACE}")
    os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")  # the loop walks the tree
    from cpkv.integrations import sglang_engine_loop
    from cpkv.integrations.sglang_hicache_cpu import install_hicache_cpu_standins

    undo = install_hicache_cpu_standins()
    old = {k: os.environ.get(k) for k in ("SGLANG_PLATFORM", "CPKV_CP_SIZE", "CPKV_OWNER_POLICY")}
    os.environ["CPKV_CP_SIZE"] = "4"
    sglang_engine_loop.install_plugins()
    yield sglang_engine_loop
    undo()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def prompts(m):
    out = m.scaled_prompts(TRACE, 300, 4)
    assert len(out) == 300 and sum(map(len, out)) == PROMPT_TOKENS
    return out


def two_passes(m, prompts, allocator, storage_dir=None):
    loop = m.EngineLoop(
        m.LoopConfig(allocator=allocator, cp_size=4, page_size=4, rank_pages=96, storage_dir=storage_dir)
    )
    first = loop.run(prompts)
    first = (first.device_hit_tokens, first.host_hit_tokens, first.storage_hit_tokens, first.load_back_pages)
    s = loop.run(prompts[::-1])
    assert s.requests == 600 and s.prompt_tokens == 2 * PROMPT_TOKENS
    assert s.cache_hit_tokens + s.computed_tokens == s.prompt_tokens
    assert s.invariant_checks == 2 * s.steps and s.load_back_off_lane_pages == 0 and s.lane_peak <= 96
    return loop, first, s


def test_engine_loop_cpkv_c4_mooncake_300(m, prompts):
    loop, first, s = two_passes(m, prompts, "cpkv")
    assert type(loop.alloc).__name__ == "OwnerLaneTokenToKVPoolAllocatorCP4"
    assert loop.tree.cache_controller.cpkv_lanes.counts["load_back_pages"] == s.load_back_pages
    assert first == (1184, 0, 0, 0)  # trace order: every reuse is one request later, still on device
    assert s.checked_pages > 0 and s.host_hit_tokens == 4 * s.load_back_pages  # every host hit loaded back
    assert (s.device_hit_tokens, s.host_hit_tokens, s.load_back_pages, s.pages_recomputed) == (
        3364,
        2312,
        578,
        0,
    )


def test_engine_loop_peer_page_interleave_c4(m, prompts):
    """The peer: the same loop on SGLang's own PageInterleavePoolAllocator (rotation bases, alloc_cyclic
    load-back, PageInterleaveHostPool of the same group capacity); cpkv's hooks pass through. Its K/V rows
    are not checked (one process moves only rank 0's rows of SGLang's sharded host pool); its loaded-back
    lanes are, against the lanes it wrote back from. Figures for docs/sglang.md's table."""
    loop, first, s = two_passes(m, prompts, "sglang")
    assert type(loop.alloc).__name__ == "PageInterleavePoolAllocator"
    assert first == (1184, 0, 0, 0)
    assert (s.device_hit_tokens, s.host_hit_tokens, s.load_back_pages, s.pages_recomputed) == (
        3364,
        2312,
        578,
        0,
    )


def test_engine_loop_cpkv_l3_restart(m, prompts, tmp_path):
    """L3 (file backend, lane keys): the loop reads pages back from L3 within a run, and a fresh loop (new
    cache, new allocator, the same directory: a restart) serves the first 60 prompts mostly from L3, every
    page loaded back onto the lane that computed it (the lane-stamped rows check it at every step)."""
    _, first, s = two_passes(m, prompts, "cpkv", storage_dir=str(tmp_path))
    assert first == (1184, 0, 1504, 376)  # pass 1: write-through host, L3 reads of evicted prefixes
    assert s.storage_hit_tokens >= 1504 and s.load_back_pages > 376
    names = [p.name for p in tmp_path.iterdir()]
    assert names and all("_lane" in n and n.split("_lane", 1)[1][0] in "0123" for n in names)
    fresh = m.EngineLoop(
        m.LoopConfig(allocator="cpkv", cp_size=4, page_size=4, rank_pages=96, storage_dir=str(tmp_path))
    )
    r = fresh.run(prompts[:60])
    assert r.invariant_checks == 2 * r.steps and r.checked_pages > 0
    assert r.storage_hit_tokens > r.prompt_tokens // 2 and r.load_back_pages * 4 >= r.storage_hit_tokens
    assert fresh.tree.cache_controller.cpkv_lanes.counts["l3_pages_read"] >= r.storage_hit_tokens // 4


def test_engine_loop_checks_fail_on_a_corrupted_or_moved_row(m, prompts):
    """The K/V check can fail: a row overwritten behind the tree's back, and a row stamped with another
    lane (what a page loaded back off its lane holds), are each named with the step, slot and lane."""
    loop = m.EngineLoop(m.LoopConfig(allocator="cpkv"))
    loop.run(prompts[:8])
    slots, _, _ = loop._device_tree_rows()
    slot = int(slots[0])
    loop.kv.v_buffer[0][slot, 0, 3] += 1  # the lane stamp of another lane
    with pytest.raises(m.LoopCheckError, match=f"cached slot {slot} .* holds rows computed on lane"):
        loop.checks()
    loop.kv.k_buffer[0][slot] += 1
    with pytest.raises(m.LoopCheckError, match="does not hold its token's K/V rows"):
        loop.checks()
