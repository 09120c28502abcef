"""cpkv against SGLang 0.5.23's own allocator and radix cache, on the same work, in one process.

    PYTHONPATH=src /work/venv-sglang/bin/python benchmarks/bench_vs_sglang.py [--quick] [--json PATH]

Needs an environment where ``import sglang`` works (see README.md); elsewhere it prints why and exits 0.
Contenders alternate round by round (cpkv first in even rounds); each round times the same work on a
fresh state, and the table gives both medians and the median and range of the per-round ratios
cpkv / SGLang. Before timing, SGLang's outputs are checked: its slots against the independent oracle
(tests/oracle.py) and cpkv at cp_size 1, and its replay hits against an unbounded reference cache.
Cases (page_size 64): bulk ``alloc_extend`` + ``free`` of one request of 8k-1M tokens; one 64-token
request; decode steps of 64 and 256 requests; the prefix-cache replay of the first 2,000 Mooncake
requests at 8,192 and 65,536 pages. cpkv runs at cp_size 1 (identical work: same pages, same slots)
and, as extra columns, at cp_size 8 (the same tokens spread over 8 lanes). The sharded rows compare, on the
same SGLang calls at C = 8, SGLang's ``PageInterleavePoolAllocator`` (SGLang column) with cpkv's
``OwnerLaneTokenToKVPoolAllocator`` (cpkv column): ``alloc_extend`` of one 64-token prompt, of 8 prompts of
1,024 tokens in one batch, of one 8,192- and one 65,536-token prompt, ``free`` per request, and a decode-like
``alloc_extend`` (``run_sharded``), over 21 rounds. See README.md.
"""

from __future__ import annotations

import statistics
import sys
from array import array

import _sglang_peer
import numpy as np
import torch
from _common import ROOT, parser, print_table, write_json
from _peer_work import (
    STEPS,
    CpkvAlloc,
    CpkvReplay,
    SGLangAlloc,
    SGLangReplay,
    ShardedAlloc,
    reference_hit_tokens,
)

sys.path.insert(0, str(ROOT / "tests"))
import oracle  # noqa: E402  (the independent per-token reference in tests/)

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
P = 64
SHARDED_ROUNDS = {False: 21, True: 5}  # alternated rounds of the sharded rows (by --quick)
HIT_TOLERANCE = 0.005  # hit tokens of the two caches must agree within 0.5 %


def alternate(rounds: int, contenders: dict) -> dict[str, list[float]]:
    """Run every contender's round function ``rounds`` times, alternating the order; seconds per round."""
    out: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(contenders[name]())
    return out


def summarise(times: dict[str, list[float]], per: int = 1) -> dict:
    """Median seconds per unit of work of each contender, and per-round ratios of each to SGLang."""
    sg = times["sglang"]
    res: dict = {"rounds": len(sg)}
    for name, ts in times.items():
        res[f"{name}_s"] = statistics.median(ts) / per
        if name != "sglang":
            ratios = [a / b for a, b in zip(ts, sg, strict=True)]
            res[f"{name}_ratio"] = statistics.median(ratios)
            res[f"{name}_ratio_range"] = [min(ratios), max(ratios)]
    return res


def check_allocators(sg) -> None:
    """SGLang's slots must equal the oracle's on a fresh pool and cpkv's (cp_size 1) on mixed batches."""
    for page_size in (4, P):
        peer, ours = SGLangAlloc(sg, page_size, 4096), CpkvAlloc(1, page_size, 4096)
        a, b = peer.fresh(), ours.fresh()
        got = peer.extend(a, [0], [1000], [-1])
        m = -(-1000 // page_size)
        want = oracle.out_cache_loc(0, 1000, -1, list(range(1, m + 1)), page_size)
        if got.tolist() != want:
            raise SystemExit(
                f"check failed: SGLang's alloc_extend slots differ from the oracle (P={page_size})"
            )
        assert_same(got, ours.extend(b, [0], [1000], [-1]), "fresh request")
        rng = np.random.default_rng(page_size)
        rows = {0: got}  # request id -> its slots so far
        for step in range(30):  # mixed batches: continue some requests, start others
            ids = rng.choice(list(rows) + [len(rows)], size=min(3, len(rows) + 1), replace=False).tolist()
            L0 = [len(rows.get(i, ())) for i in ids]
            E = rng.integers(1, 3 * page_size, len(ids)).tolist() if step % 3 else [1] * len(ids)
            last = [int(rows[i][-1]) if i in rows else -1 for i in ids]
            got = peer.extend(a, L0, E, last)
            assert_same(got, ours.extend(b, L0, E, last), f"batch {step}")
            for i, e, s in zip(ids, E, np.split(got, np.cumsum(E)[:-1]), strict=True):
                rows[i] = np.concatenate([rows.get(i, np.zeros(0, np.int64)), s])
                assert e == s.shape[0]
        slots = np.concatenate(list(rows.values()))
        if np.unique(slots).shape[0] != slots.shape[0] or (slots < page_size).any():
            raise SystemExit("check failed: SGLang handed out a slot twice or a slot of page 0")
    seq = np.random.default_rng(1).integers(1, 4096, 64)
    _, got = SGLangAlloc(sg, P, 8192).decode(seq, 70)
    _, want = CpkvAlloc(1, P, 8192).decode(seq, 70)
    assert_same(got, want, "decode steps")


def check_sharded(contenders: dict) -> None:
    """Both sharded allocators hand out 14 distinct pages of whole slots on a fresh pool, padding pages never
    (page ids >= C), each page of a request once; cpkv's pages of one request also spread over the lanes
    within one page (C-ZIGZAG). SystemExit otherwise."""
    for name, a in contenders.items():
        alloc = a.fresh()
        out = a.extend(alloc, [0, 0], [8 * P + 3, 5 * P], [-1, -1])
        pages = np.unique(out // P)
        if out.shape[0] != 13 * P + 3 or pages.shape[0] != 14 or pages.min() < a.C:
            raise SystemExit(
                f"check failed: {name}'s sharded alloc_extend gave {pages.shape[0]} pages {pages[:4]} ..."
            )
        lanes = np.bincount(np.unique(out[: 8 * P + 3] // P) % a.C, minlength=a.C)
        if name == "cpkv" and lanes.max() - lanes.min() > 1:
            raise SystemExit(f"check failed: cpkv's 9 pages of one request on lanes {lanes.tolist()}")


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.tolist() != want.tolist():
        raise SystemExit(f"check failed: SGLang's and cpkv's (cp_size 1) slots differ on {what}")


def load_prompts(n: int) -> list[np.ndarray]:
    from cpkv.sim.trace import load_trace, prompt_token_ids

    return [prompt_token_ids(r) for r in load_trace(TRACE, max_requests=n)]


def replay_round(make, prompts, convert) -> tuple[float, object]:
    import time

    rep = make()
    items = [convert(t) for t in prompts]
    t0 = time.perf_counter()
    for t in items:
        rep.request(t)
    return time.perf_counter() - t0, rep


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--cases",
        default="bulk,one,decode,replay,sharded",
        help="comma-separated case groups to run (default: bulk,one,decode,replay,sharded)",
    )
    args = p.parse_args()
    groups = set(args.cases.split(","))
    sg = _sglang_peer.load()
    if isinstance(sg, str):
        print(f"bench_vs_sglang: skipped: {sg}")
        return
    quick = args.quick
    torch.set_num_threads(1)  # both single-threaded: on a shared 2-core box torch's 2 OpenMP threads stall
    print(
        f"SGLang {sg.version}, torchvision stubbed: {sg.torchvision_stubbed}; checking its outputs ...",
        flush=True,
    )
    check_allocators(sg)
    rounds = 3 if quick else 11
    rows, out = [], {}

    def add(case: str, times: dict, per: int, unit: str, scale: float) -> None:
        s = out[case] = summarise(times, per)
        lo, hi = s["cpkv_ratio_range"]
        row = [case, unit, s["sglang_s"] * scale, s["cpkv_s"] * scale, s["cpkv_ratio"], f"{lo:.3g}-{hi:.3g}"]
        for k in ("cpkv_c8", "cpkv_c8_plan"):
            row += [s[f"{k}_s"] * scale, s[f"{k}_ratio"]] if f"{k}_s" in s else ["-", "-"]
        rows.append(row)
        print_table("", HEADER, [row])

    # Bulk alloc_extend + free, and one 64-token request.
    for E in ([8192] if quick else [8192, 65536, 1 << 20]) if "bulk" in groups else []:
        pages, calls = E // P + 8, max(1, (1 << 20) // E // (16 if quick else 1))
        c = {
            "cpkv": CpkvAlloc(1, P, pages),
            "sglang": SGLangAlloc(sg, P, pages),
            "cpkv_c8": CpkvAlloc(8, P, pages + 64),
        }
        fns = {k: (lambda v=v, E=E, calls=calls: v.extend_free(E, calls)) for k, v in c.items()}
        add(f"bulk extend+free {E:,}", alternate(rounds, fns), calls, "ms/call", 1e3)
    calls = 50 if quick else 500
    c = (
        {}
        if "one" not in groups
        else {
            "cpkv": CpkvAlloc(1, P, 64),
            "sglang": SGLangAlloc(sg, P, 64),
            "cpkv_c8": CpkvAlloc(8, P, 64),
            "cpkv_c8_plan": CpkvAlloc(8, P, 64, plan=True),
        }
    )
    if c:
        fns = {k: (lambda v=v: v.extend_free(64, calls)) for k, v in c.items()}
        add("one 64-token request", alternate(rounds, fns), calls, "us/call", 1e6)

    # Sharded, C = 8: SGLang's PageInterleavePoolAllocator (SGLang column) against cpkv's SGLang allocator,
    # OwnerLaneTokenToKVPoolAllocator at C = 8 (cpkv C=1 column), on the same SGLang calls: alloc_extend of new
    # prompts, free of finished requests, and the decode-like call (run_sharded).
    if "sharded" in groups:
        run_sharded(sg, quick, add, SHARDED_ROUNDS[quick])

    # Decode steps: B requests of random lengths (prefilled untimed), then `steps` steps of all of them.
    steps = 8 if quick else 64
    for B in ([64] if quick else [64, 256]) if "decode" in groups else []:
        seq = np.random.default_rng(B).integers(1, 4096, B)
        pages = int((seq // P + 2).sum()) + B
        c = {
            "cpkv": CpkvAlloc(1, P, pages),
            "sglang": SGLangAlloc(sg, P, pages),
            "cpkv_c8": CpkvAlloc(8, P, pages + 8 * B),
            "cpkv_c8_plan": CpkvAlloc(8, P, pages + 8 * B, plan=True),
        }
        fns = {k: (lambda v=v, seq=seq: v.decode(seq, steps)[0]) for k, v in c.items()}
        add(f"decode step, {B} requests", alternate(rounds, fns), steps, "us/step", 1e6)

    # Prefix-cache replay of the first N Mooncake requests.
    n_req = 100 if quick else 2000
    replay_rows, pools = [], ([4096, 16384] if quick else [8192, 65536]) if "replay" in groups else []
    if pools and not TRACE.exists():
        print(f"prefix replay skipped: no trace at {TRACE}")
        pools = []
    if pools:
        prompts = load_prompts(n_req)
        reference = reference_hit_tokens(prompts, P)
        check_unbounded(sg, prompts[: 50 if quick else 200], P)
    for pool in pools:
        makers = {
            "cpkv": (lambda pool=pool: CpkvReplay(1, P, pool), lambda t: t),
            "sglang": (lambda pool=pool: SGLangReplay(sg, P, pool), as_array),
            "cpkv_c8": (lambda pool=pool: CpkvReplay(8, P, pool), lambda t: t),
        }
        reps: dict = {}

        def runner(name, make, convert, prompts=prompts, reps=reps):
            s, rep = replay_round(make, prompts, convert)
            reps.setdefault(name, []).append(rep)
            return s

        times = alternate(2 if quick else 3, {k: (lambda k=k, m=m: runner(k, *m)) for k, m in makers.items()})
        hits = {k: v[0].hit_tokens for k, v in reps.items()}
        if any(len({r.hit_tokens for r in v}) != 1 for v in reps.values()):
            raise SystemExit("check failed: a contender's hit tokens differ between rounds")
        if any(v[0].failed for v in reps.values()):
            raise SystemExit(
                f"check failed: failed allocations { ({k: v[0].failed for k, v in reps.items()}) }"
            )
        gap = abs(hits["cpkv"] - hits["sglang"]) / max(1, hits["sglang"])
        if gap > HIT_TOLERANCE:
            raise SystemExit(f"check failed: hit tokens differ by {gap:.2%}: {hits}")
        case = f"prefix replay {n_req:,} req, {pool:,} pages"
        add(case, times, 1, "s/replay", 1.0)
        out[case].update(
            hit_tokens=hits,
            hit_gap=gap,
            reference_unbounded_hits=reference,
            steps_s={k: {s: v[0].step_s[s] for s in STEPS} for k, v in reps.items()},
        )
        for k in ("sglang", "cpkv", "cpkv_c8"):
            replay_rows.append([case, k, f"{hits[k]:,}", *[reps[k][0].step_s[s] * 1e3 for s in STEPS]])

    print()
    print_table(
        f"cpkv / SGLang {sg.version} (medians of {rounds} alternated rounds, sharded rows "
        f"{SHARDED_ROUNDS[quick]}; ratio < 1: cpkv faster)",
        HEADER,
        rows,
    )
    if replay_rows:
        print_table(
            "prefix replay by step (first round, ms)", ["case", "who", "hit tokens", *STEPS], replay_rows
        )
    write_json(
        args.json,
        {
            "benchmark": "vs_sglang",
            "quick": quick,
            "sglang": sg.version,
            "torchvision_stubbed": sg.torchvision_stubbed,
            "cases": out,
        },
    )


def run_sharded(sg, quick: bool, add, rounds: int) -> None:
    """The sharded rows (C = 8, P = 64), each timed over ``rounds`` alternated rounds: ``alloc_extend`` of one
    64-token prompt, of 8 prompts of 1,024 tokens in one batch, of one 8,192- and one 65,536-token prompt
    (SGLang's tensors in, ``out_cache_loc`` out; freed untimed); ``free`` of 8 requests of 1,024 tokens, one
    call each; and the decode-like call: one token for each of 64 chains that end on a page boundary (SGLang's
    sharded allocator has no ``alloc_decode`` and extends only page-aligned prefixes; ``ShardedAlloc.continued``)."""
    C = 8
    cases = [(1, 64, 50 if quick else 400), (8, 1024, 5 if quick else 40), (1, 8192, 5 if quick else 40)]
    cases += [] if quick else [(1, 65536, 8)]
    for B, E, calls in cases:
        pages = B * -(-E // P) + 8 * C
        c = {k: ShardedAlloc(sg, k, C, P, pages) for k in ("cpkv", "sglang")}
        check_sharded(c)
        fns = {k: (lambda v=v, B=B, E=E, calls=calls: v.prompts(B, E, calls)) for k, v in c.items()}
        what = "one prompt" if B == 1 else f"{B} prompts (one batch)"
        add(
            f"sharded C=8 alloc_extend, {what} of {E:,} tokens", alternate(rounds, fns), calls, "us/call", 1e6
        )
    calls = 5 if quick else 40
    c = {k: ShardedAlloc(sg, k, C, P, 8 * 16 + 8 * C) for k in ("cpkv", "sglang")}
    fns = {k: (lambda v=v: v.frees(8, 1024, calls)) for k, v in c.items()}
    add(
        "sharded C=8 free, 8 requests of 1,024 tokens (a call each)",
        alternate(rounds, fns),
        calls * 8,
        "us/call",
        1e6,
    )
    B, calls = 64, 20 if quick else 200
    seq_pages = np.random.default_rng(B).integers(1, 33, B)
    c = {k: ShardedAlloc(sg, k, C, P, int(seq_pages.sum()) + 2 * B + 8 * C) for k in ("cpkv", "sglang")}
    check_continued(c, seq_pages)
    fns = {k: (lambda v=v: v.continued(seq_pages, calls)[0]) for k, v in c.items()}
    add(
        f"sharded C=8 decode-like alloc_extend, {B} chains x 1 token",
        alternate(rounds, fns),
        calls,
        "us/call",
        1e6,
    )


def check_continued(contenders: dict, seq_pages: np.ndarray) -> None:
    """Both allocators give each continued chain one slot, the first of a page no chain holds (a distinct
    page per chain, never a padding page). SystemExit otherwise."""
    for name, a in contenders.items():
        _, out = a.continued(seq_pages, 1)
        pages = np.unique(out // P)
        if out.shape[0] != seq_pages.shape[0] or (out % P).any() or pages.shape[0] != out.shape[0]:
            raise SystemExit(f"check failed: {name}'s decode-like slots {out[:8].tolist()} ...")
        if pages.min() < a.C:
            raise SystemExit(f"check failed: {name} handed out padding page {int(pages.min())}")


def check_unbounded(sg, prompts, page_size) -> None:
    """With a pool that never evicts, both caches must hit exactly the reference's tokens."""
    want = reference_hit_tokens(prompts, page_size)
    pool = sum(t.shape[0] // page_size + 1 for t in prompts) + 8
    for rep, conv in (
        (SGLangReplay(sg, page_size, pool), as_array),
        (CpkvReplay(1, page_size, pool), lambda t: t),
    ):
        for t in prompts:
            rep.request(conv(t))
        if rep.hit_tokens != want:
            raise SystemExit(f"check failed: {rep.name} hit {rep.hit_tokens} tokens, the reference {want}")


def as_array(t: np.ndarray) -> array:
    """Token ids as SGLang's RadixKey holds them (``array('q')``)."""
    a = array("q")
    a.frombytes(t.tobytes())
    return a


HEADER = [
    "case",
    "unit",
    "SGLang",
    "cpkv C=1",
    "ratio",
    "ratio range",
    "cpkv C=8",
    "ratio C=8",
    "C=8 +.plan",
    "ratio +.plan",
]


if __name__ == "__main__":
    main()
