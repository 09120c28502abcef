"""Issue 33 point 6: SGLang 0.5.23's scheduler components over the Mooncake trace at C=4, on CPU.

``cpkv.integrations.sglang_engine_loop.EngineLoop`` drives ``PrefillAdder`` admission, ``UnifiedRadixCache``
with HiCache (``io_backend="direct"``) and an L3 ``file`` store, cpkv's allocator from SGLang's platform hook
with cpkv's plugins installed (scheduler hooks, HiCache owner replay), and SGLang's invariant checker after
every step, over the first 300 requests of ``../shared/traces/mooncake_conversation_trace.jsonl`` and then the
same 300 in reverse order (the trace reuses a prefix one request later, so reverse order is what makes
HiCache load pages back). Token scale: a 512-token trace block is 4 tokens (one page of P=4), 33,514
prompt tokens a pass; each rank's pool holds 96 pages. Every step checks (``EngineLoop.checks``): no
invariant violation, no slot outside its rank's buffer, the rows read back through ``read_slots`` equal
the rows written, every device page of the tree holding its tokens' K/V rows, every loaded-back page on
the lane it was written back from (an oracle wrapping the controller instance). About 35 s here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

TRACE = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


@pytest.fixture(scope="module")
def loop_module():
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


def test_engine_loop_cpkv_c4_mooncake_300(loop_module, tmp_path):
    if not TRACE.exists():
        pytest.skip(f"no trace at {TRACE}")
    m = loop_module
    prompts = m.scaled_prompts(TRACE, 300, 4)
    assert len(prompts) == 300 and sum(map(len, prompts)) == 33514
    loop = m.EngineLoop(m.LoopConfig(allocator="cpkv", cp_size=4, page_size=4, rank_pages=96,
                                     storage_dir=str(tmp_path)))  # fmt: skip
    assert loop.alloc.cp_size == 4 and type(loop.alloc).__name__ == "OwnerLaneTokenToKVPoolAllocatorCP4"
    s = loop.run(prompts)
    assert (s.requests, s.host_hit_tokens, s.load_back_pages) == (300, 0, 0)  # reuse is one request later
    s = loop.run(prompts[::-1])
    assert s.requests == 600 and s.prompt_tokens == 2 * 33514
    assert s.cache_hit_tokens + s.computed_tokens == s.prompt_tokens
    assert s.invariant_checks == 2 * s.steps and s.checked_pages > 0
    assert s.load_back_pages > 0 and s.host_hit_tokens == 4 * s.load_back_pages  # every host hit loaded back
    assert s.load_back_off_lane_pages == 0 and s.pages_recomputed == 0
    assert s.lane_peak <= 96
    assert (s.device_hit_tokens, s.host_hit_tokens, s.load_back_pages) == (3364, 2312, 578)  # measured, deterministic
    lane_keys = [p.name for p in tmp_path.iterdir() if "_lane" in p.name]
    assert lane_keys and all(p.name.rsplit("_lane", 1)[1][0] in "0123" for p in tmp_path.iterdir() if "_lane" in p.name)


def test_engine_loop_checks_fail_on_a_corrupted_row(loop_module):
    """The K/V check can fail: a cached row overwritten behind the tree's back is named with its step."""
    if not TRACE.exists():
        pytest.skip(f"no trace at {TRACE}")
    m = loop_module
    loop = m.EngineLoop(m.LoopConfig(allocator="cpkv"))
    loop.run(m.scaled_prompts(TRACE, 8, 4))
    slots, _, _ = loop._device_tree_rows()
    loop.kv.k_buffer[0][int(slots[0])] += 1
    with pytest.raises(m.LoopCheckError, match="does not hold its token's K/V rows"):
        loop.checks()


def test_engine_loop_peer_page_interleave_c4(loop_module):
    """The peer: the same loop on SGLang's own PageInterleavePoolAllocator (rotation bases, alloc_cyclic
    load-back, PageInterleaveHostPool); cpkv's hooks pass through. Its K/V rows are not checked: one process
    moves only rank 0's rows of SGLang's sharded host pool. Figures for docs/sglang.md's table."""
    if not TRACE.exists():
        pytest.skip(f"no trace at {TRACE}")
    m = loop_module
    prompts = m.scaled_prompts(TRACE, 300, 4)
    loop = m.EngineLoop(m.LoopConfig(allocator="sglang", cp_size=4, page_size=4, rank_pages=96))
    assert type(loop.alloc).__name__ == "PageInterleavePoolAllocator"
    loop.run(prompts)
    s = loop.run(prompts[::-1])
    assert s.invariant_checks == 2 * s.steps and s.load_back_off_lane_pages == 0
    assert s.cache_hit_tokens + s.computed_tokens == s.prompt_tokens == 2 * 33514
    assert (s.device_hit_tokens, s.host_hit_tokens, s.load_back_pages, s.pages_recomputed) == (3364, 11260, 2815, 0)
