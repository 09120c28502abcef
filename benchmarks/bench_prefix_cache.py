"""Prefix-cache replay of the Mooncake trace: match, lock, evict, alloc, insert, unlock, timed per step.

    python benchmarks/bench_prefix_cache.py [--quick] [--requests N] [--pools 8192,65536] [--json PATH]

The first N requests (default 2,000; --quick: 100) run one after another through one ``PrefixCache``
over one ``OwnerLaneAllocator`` (C=8, P=64, owner policy rotation) whose pool holds the given number of
pages in all: match the prompt less its last token, lock the hit, plan the rest (``plan_extend``), evict
each lane's shortfall, ``alloc_extend``, insert, move the lock, unlock, free the partial last page.
Seconds per step summed over the replay ("alloc" includes the plan); "nodes" is the tree's live node
count at the end, "nodes made" all nodes it created (the per-page tree of cpkv 0.1: one per cached
page). See README.md.
"""

from __future__ import annotations

import time

import numpy as np
from _common import ROOT, parser, print_table, write_json

from cpkv import CPConfig, OwnerLaneAllocator, PrefixCache
from cpkv.sim.trace import load_trace, prompt_token_ids

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
STEPS = ("match", "lock", "evict", "alloc", "insert", "unlock")


def replay(prompts: list[np.ndarray], num_pages: int, cp_size: int = 8, page_size: int = 64) -> dict:
    """One replay; returns seconds per step, hit tokens, evicted pages and live nodes."""
    alloc = OwnerLaneAllocator(CPConfig(cp_size, page_size, "rotation"), num_pages // cp_size)
    cache, t, hit = PrefixCache(alloc), dict.fromkeys(STEPS, 0.0), 0
    for tokens in prompts:
        c0 = time.perf_counter()
        m = cache.match_prefix(tokens[:-1])
        c1 = time.perf_counter()
        cache.lock(m.handle)
        c2 = time.perf_counter()
        args = ([m.device_len], [len(tokens) - m.device_len], [m.last_loc])
        short = (
            np.bincount(alloc.plan_extend(*args).page_owners, minlength=cp_size) - alloc.free_pages_per_lane()
        )
        c3 = time.perf_counter()
        for lane in np.flatnonzero(short > 0).tolist():
            cache.evict(lane, int(short[lane]))
        t["evict"] += time.perf_counter() - c3
        ext = alloc.alloc_extend(*args)
        c4 = time.perf_counter()
        row = np.concatenate([m.device_slots, ext.out_cache_loc.numpy()])
        r = cache.insert(tokens, row)
        c5 = time.perf_counter()
        cache.lock(r.handle)
        cache.unlock(m.handle)
        cache.unlock(r.handle)
        c6 = time.perf_counter()
        tail = row[r.slots.shape[0] :]
        if tail.size:
            alloc.free([int(tail[0]) // page_size])
        hit += m.device_len
        t["match"] += c1 - c0
        t["lock"] += c2 - c1
        t["alloc"] += c4 - c2
        t["insert"] += c5 - c4
        t["unlock"] += c6 - c5
    t["alloc"] -= t["evict"]
    c, tree = cache.counters(), getattr(cache, "tree", None)  # cpkv 0.1: one node per page, no tree
    live = tree.num_nodes if tree is not None else cache.total_cached_pages + len(cache.host)
    made = tree.nodes_created if tree is not None else c["inserted_pages"]
    return {
        "steps_s": t,
        "total_s": sum(t.values()),
        "hit_tokens": hit,
        "nodes": live,
        "nodes_made": made,
        "evicted_pages": int(sum(c["evicted_pages"])),
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=None, help="trace requests replayed (default 2000)")
    p.add_argument("--pools", default="8192,65536", help="pool sizes in pages, comma separated")
    args = p.parse_args()
    n = args.requests or (100 if args.quick else 2000)
    prompts = [prompt_token_ids(r) for r in load_trace(TRACE, max_requests=n)]
    rows, out = [], {}
    for pool in (int(x) for x in args.pools.split(",")):
        res = replay(prompts, pool)
        out[pool] = res
        rows.append(
            [
                pool,
                n,
                res["total_s"],
                *(res["steps_s"][s] for s in STEPS),
                res["hit_tokens"],
                res["evicted_pages"],
                res["nodes"],
                res["nodes_made"],
            ]
        )
    header = [
        "pool pages",
        "requests",
        "total s",
        *(f"{s} s" for s in STEPS),
        "hit tokens",
        "evicted",
        "nodes",
        "nodes made",
    ]
    print_table("prefix-cache replay, Mooncake trace (C=8, P=64, rotation)", header, rows)
    write_json(args.json, {"benchmark": "prefix_cache", "quick": args.quick, "requests": n, "pools": out})


if __name__ == "__main__":
    main()
