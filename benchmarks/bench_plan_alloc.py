"""plan_batch and alloc_extend: time, tokens/s, ratio to the memory bound and to the naive oracle.

    python benchmarks/bench_plan_alloc.py [--quick] [--json PATH] [--cp-strategy zigzag|interleave|compare]

Cases (all requests fresh, prefix_len 0): (a) 1 x 1,048,576 tokens at page_size 64 and 1; (b) 64 x 16,384;
(c) 256 x 64 (decode-like); (d) 1 x 64; cp_size 8. Then (d) at cp_size 2 with a 1,000-page pool against
cp_size 16 with a 1,000,000-page pool (per-call cost must not grow with either). ``--cp-strategy compare``
times cases (a)-(d) under zigzag and interleave instead, alternated (zigzag, interleave, zigzag, ...) over
``--rounds`` rounds, and prints each strategy's median of the rounds' medians and their ratio (C-INTERLEAVE;
target <= 1.3). See README.md.
"""

from __future__ import annotations

import math
import statistics
import sys

import numpy as np
from _common import ROOT, copy_bound_s, fmt, median_s, parser, print_table, write_json

from cpkv import CPConfig, OwnerLaneAllocator, plan_batch

sys.path.insert(0, str(ROOT / "tests"))
import oracle  # noqa: E402  (the independent per-token reference in tests/)

ORACLE_TOKENS = 1 << 20  # the oracle runs on at most this many tokens ...
ORACLE_PAGES = 1 << 16  # ... and pages (its fresh_alloc_pages is O(pages x Q)); beyond, scaled per token


def oracle_s(B: int, E: int, C: int, P: int) -> tuple[float, bool]:
    """Seconds of the per-token oracle (plan, fresh pages, out_cache_loc) for B x E; scaled per token when
    the case is shrunk to ORACLE_TOKENS / ORACLE_PAGES (a lower bound: its allocation is superlinear)."""
    pages = B * math.ceil(E / P)
    scale = min(1.0, ORACLE_TOKENS / (B * E), ORACLE_PAGES / pages)
    b, e = (B, max(1, round(E * scale))) if B == 1 else (max(1, round(B * scale)), E)

    def run() -> None:
        plan = oracle.plan_batch([0] * b, [e] * b, C, P)
        owners = plan["page_owners"]
        q = max(owners.count(r) for r in range(C)) + 2  # page 0 is reserved
        pages = oracle.fresh_alloc_pages(owners, C, q)
        k = 0
        for req in plan["requests"]:
            m = len(req["page_owners"])
            oracle.out_cache_loc(0, e, -1, pages[k : k + m], P)
            k += m

    t = median_s(run, 1 if b * e > 4096 else 20)
    return t * (B * E) / (b * e), (b, e) != (B, E)


def measure(
    B: int, E: int, C: int, P: int, repeats: int, pool_pages: int | None = None, cp_strategy: str = "zigzag"
) -> dict:
    """Median plan_batch and alloc_extend seconds for B fresh requests of E tokens (one allocator; the pages
    of one call are freed, untimed, before the next, so every call sees the same state)."""
    cfg = CPConfig(C, P, cp_strategy=cp_strategy)
    L0, Es, last = np.zeros(B, np.int64), np.full(B, E, np.int64), np.full(B, -1, np.int64)
    plan = plan_batch(L0, Es, cfg)
    Q = pool_pages // C if pool_pages else int(np.bincount(plan.page_owners, minlength=C).max()) + 2
    alloc = OwnerLaneAllocator(cfg, Q)
    held: list[np.ndarray] = []

    def release() -> None:
        while held:
            alloc.free(held.pop())

    t_plan = median_s(lambda: plan_batch(L0, Es, cfg), repeats)

    def alloc_and_plan() -> None:  # .plan read: the single-page path ((c), (d)) builds it on first access
        res = alloc.alloc_extend(L0, Es, last)
        res.plan  # noqa: B018
        held.append(res.new_pages)

    t_alloc = median_s(alloc_and_plan, repeats, release)
    m = plan.page_owners.shape[0]
    n = B * E
    # Output bytes: token_owner, gather_index, out_cache_loc (per token); page_owners, new_pages (per page).
    bound = copy_bound_s(8 * (3 * n + 2 * m), 3 * repeats)
    return dict(B=B, E=E, C=C, P=P, Q=Q, tokens=n, pages=m, plan_s=t_plan, alloc_s=t_alloc, bound_s=bound)


def compare_strategies(cases: dict, reps: int, small_reps: int, rounds: int) -> dict:
    """Cases (a)-(d) under zigzag and interleave, alternated round by round; prints the table, returns the
    figures: per case and strategy the rounds' plan and plan+alloc medians (seconds) and their median."""
    out: dict = {}
    for name, (B, E, C, P) in cases.items():
        n = reps if B * E > 100_000 else small_reps
        got: dict[str, list[dict]] = {s: [] for s in STRATEGIES}
        for _ in range(rounds):
            for s in STRATEGIES:
                got[s].append(measure(B, E, C, P, n, cp_strategy=s))
        out[name] = {s: {k: [r[k] for r in got[s]] for k in ("plan_s", "alloc_s")} for s in STRATEGIES}
        for s in STRATEGIES:
            out[name][s].update(
                {f"{k}_median": statistics.median(out[name][s][k]) for k in ("plan_s", "alloc_s")}
            )
    rows = []
    for name, r in out.items():
        z, i = r["zigzag"], r["interleave"]
        rows.append(
            [
                name,
                z["plan_s_median"] * 1e3,
                i["plan_s_median"] * 1e3,
                i["plan_s_median"] / z["plan_s_median"],
                z["alloc_s_median"] * 1e3,
                i["alloc_s_median"] * 1e3,
                i["alloc_s_median"] / z["alloc_s_median"],
            ]
        )
    print_table(
        f"zigzag vs interleave, cp_size 8, {rounds} alternated rounds (median of the rounds' medians; "
        "target interleave / zigzag <= 1.3)",
        [
            "case",
            "zigzag plan ms",
            "interleave plan ms",
            "ratio",
            "zigzag plan+alloc ms",
            "interleave plan+alloc ms",
            "ratio",
        ],
        rows,
    )
    return out


STRATEGIES = ("zigzag", "interleave")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--cp-strategy",
        choices=[*STRATEGIES, "compare"],
        default="zigzag",
        help="the CP strategy of every plan, or compare: zigzag and interleave alternated",
    )
    p.add_argument("--rounds", type=int, default=5, help="alternated rounds of --cp-strategy compare")
    args = p.parse_args()
    big, reps, small_reps = (1 << 14, 5, 50) if args.quick else (1 << 20, 9, 300)
    cases = {
        "a P=64": (1, big, 8, 64),
        "a P=1": (1, big, 8, 1),
        "b": (64, big // 64, 8, 64),
        "c decode": (256, 64, 8, 64),
        "d": (1, 64, 8, 64),
    }
    if args.cp_strategy == "compare":
        out = compare_strategies(cases, reps, small_reps, 2 if args.quick else args.rounds)
        write_json(args.json, {"benchmark": "plan_alloc_strategies", "quick": args.quick, "cases": out})
        return
    rows, out = [], {}
    for name, (B, E, C, P) in cases.items():
        r = measure(B, E, C, P, reps if B * E > 100_000 else small_reps, cp_strategy=args.cp_strategy)
        r["oracle_s"], r["oracle_scaled"] = oracle_s(B, E, C, P)
        out[name] = r
        rows.append(
            [
                name,
                C,
                P,
                B,
                r["tokens"],
                r["plan_s"] * 1e3,
                r["alloc_s"] * 1e3,
                r["tokens"] / r["alloc_s"] / 1e6,
                r["bound_s"] * 1e3,
                r["alloc_s"] / r["bound_s"],
                fmt(r["oracle_s"] * 1e3) + ("*" if r["oracle_scaled"] else ""),
                r["oracle_s"] / r["alloc_s"],
            ]
        )
    header = [
        "case",
        "C",
        "P",
        "reqs",
        "tokens",
        "plan ms",
        "plan+alloc ms",
        "Mtok/s",
        "bound ms",
        "x bound",
        "oracle ms",
        "x faster",
    ]
    print_table("plan_batch / alloc_extend (median; * = oracle scaled per token)", header, rows)

    pools = {"d C=2 pool 1e3": (2, 1000), "d C=16 pool 1e6": (16, 1_000_000)}
    scale_rows = []
    for name, (C, pool) in pools.items():
        out[name] = r = measure(1, 64, C, 64, small_reps * 3, pool_pages=pool, cp_strategy=args.cp_strategy)
        scale_rows.append([name, C, pool, r["plan_s"] * 1e6, r["alloc_s"] * 1e6])
    ratio = out["d C=16 pool 1e6"]["alloc_s"] / out["d C=2 pool 1e3"]["alloc_s"]
    out["d_scaling_ratio"] = ratio
    print_table(
        f"(d) per-call cost vs cp_size and pool: ratio {ratio:.2f} (target <= 1.3)",
        ["case", "C", "pool pages", "plan us", "plan+alloc us"],
        scale_rows,
    )
    write_json(args.json, {"benchmark": "plan_alloc", "quick": args.quick, "cases": out})


if __name__ == "__main__":
    main()
