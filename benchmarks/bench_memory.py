"""Memory of planner and allocator state: bytes per token and per page, measured with tracemalloc.

    python benchmarks/bench_memory.py [--quick] [--json PATH]

"retained" is what the result object keeps alive (BatchPlan; ExtendAllocation = plan + out_cache_loc +
new_pages); "peak" is the most traced memory during the call, result included. numpy reports its array
buffers to tracemalloc, and out_cache_loc shares its numpy buffer on CPU. See README.md.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

import numpy as np
from _common import parser, print_table, write_json

from cpkv import CPConfig, OwnerLaneAllocator, plan_batch


def traced(make: Callable[[], object]) -> tuple[object, int, int]:
    """``(result, retained bytes, peak bytes)`` of ``make()``, counted from a clean tracemalloc start."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result = make()
    now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, now - base, peak - base


def with_plan(res):
    """``res`` after reading its ``plan`` (built on first access by the single-page path)."""
    res.plan  # noqa: B018
    return res


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    big = 1 << 14 if args.quick else 1 << 20
    cases = {
        "a P=64": (1, big, 64),
        "a P=1": (1, big, 1),
        "b": (64, big // 64, 64),
        "c decode": (256, 64, 64),
    }
    C, rows, out = 8, [], {}
    for name, (B, E, P) in cases.items():
        cfg = CPConfig(C, P)
        L0, Es, last = np.zeros(B, np.int64), np.full(B, E, np.int64), np.full(B, -1, np.int64)
        plan, plan_kept, plan_peak = traced(lambda: plan_batch(L0, Es, cfg))  # noqa: B023
        Q = int(np.bincount(plan.page_owners, minlength=C).max()) + 2
        alloc, state, _ = traced(lambda: OwnerLaneAllocator(cfg, Q))  # noqa: B023
        # .plan read inside: a batch whose requests need at most one page each (c) builds it on first access
        _, ext_kept, ext_peak = traced(lambda: with_plan(alloc.alloc_extend(L0, Es, last)))  # noqa: B023
        n, pool = B * E, alloc.num_pages
        out[name] = dict(
            tokens=n,
            pages=plan.num_tokens and int(plan.page_owners.shape[0]),
            pool_pages=pool,
            plan_retained=plan_kept,
            plan_peak=plan_peak,
            alloc_retained=ext_kept,
            alloc_peak=ext_peak,
            allocator_state=state,
        )
        per_token = [plan_kept / n, plan_peak / n, ext_kept / n, ext_peak / n]
        rows.append([name, P, n, *per_token, pool, state / pool])
    header = [
        "case",
        "P",
        "tokens",
        "plan B/tok",
        "plan peak B/tok",
        "alloc_extend B/tok",
        "alloc_extend peak B/tok",
        "pool pages",
        "allocator B/page",
    ]
    print_table(f"planner and allocator memory, C={C} (tracemalloc)", header, rows)
    write_json(args.json, {"benchmark": "memory", "quick": args.quick, "cases": out})


if __name__ == "__main__":
    main()
