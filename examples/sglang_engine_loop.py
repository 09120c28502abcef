"""SGLang 0.5.23's scheduler components over the Mooncake trace at C=4 on the CPU, cpkv's allocator through
the plugins (issue 33 point 6; docs/sglang.md, "Engine loop on the CPU").

PrefillAdder admission, UnifiedRadixCache with HiCache and an L3 file store, the allocator SGLang's platform
hook returns under SGLANG_PLATFORM=cpkv, SGLang's invariant checker after every step; the model forward is
replaced by writing each token's known K/V rows through cpkv's KV-row path. The first 300 requests run in
trace order, then in reverse (which makes HiCache load pages back), then a fresh loop on the same L3
directory (a restart) runs the first 60 again from L3. A trace block (512 tokens) is 4 tokens
here. Run after `make test-sglang` built the venv:
    .venv-sglang/bin/python examples/sglang_engine_loop.py
"""

import os
import tempfile
from pathlib import Path

from cpkv.integrations.cpu_stubs import install_torchvision_stub

install_torchvision_stub()  # SGLang imports torchvision; no CPU build of it imports with torch 2.13
os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
os.environ["CPKV_CP_SIZE"] = "4"

from cpkv.integrations import sglang_engine_loop as m  # noqa: E402
from cpkv.integrations.sglang_hicache_cpu import install_hicache_cpu_standins  # noqa: E402

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"

install_hicache_cpu_standins()  # HiCache's host pool and direct copies on the CPU
m.install_plugins()
prompts = m.scaled_prompts(TRACE, 300, 4)


def show(what: str, s) -> None:
    print(
        f"{what:30s}: {s.requests} requests in {s.steps} steps; hit tokens device {s.device_hit_tokens}, "
        f"host {s.host_hit_tokens}, L3 {s.storage_hit_tokens}; computed {s.computed_tokens}; pages loaded back "
        f"{s.load_back_pages}, recomputed {s.pages_recomputed}; lane peak {s.lane_peak} of 96 pages, imbalance "
        f"peak {s.imbalance_peak:.3f}; {s.invariant_checks} invariant checks, {s.checked_pages} cached pages checked"
    )


with tempfile.TemporaryDirectory() as l3:
    loop = m.EngineLoop(m.LoopConfig(allocator="cpkv", cp_size=4, page_size=4, rank_pages=96, storage_dir=l3))
    show("trace order", loop.run(prompts))
    show("+ reverse order", loop.run(prompts[::-1]))
    restarted = m.EngineLoop(
        m.LoopConfig(allocator="cpkv", cp_size=4, page_size=4, rank_pages=96, storage_dir=l3)
    )
    show("restart (new cache), first 60", restarted.run(prompts[:60]))
