"""Interleave against zigzag on the Mooncake trace under two ways of pricing a rank's runs (issue 36).

    python benchmarks/bench_interleave_pricing.py [--quick] [--max-requests N] [--policy balanced] [--json PATH]

The measured cost model (``cpkv.cost.MeasuredCost``, SPEC C-COST) prices a rank's runs ``[a_j, b_j)`` as
``F + sum_j (attention(b_j - a_j, a_j) - F)``, ``F = attention(1, 0)``: each run one call of the measured DSA
module less its fixed cost. Past the top-k keys a call's own cost (the indexer's path, about 36 ms over the
61 layers) is most of a one-page run's price, and interleave gives a rank about ``m / C`` such runs where
zigzag gives it two per request. "one call" prices a rank's runs as one varlen call instead: the call's cost
once, at the rank's longest prefix, plus each run's work at its own prefix,
``attention(1, max_j a_j) + sum_j (attention(b_j - a_j, a_j) - attention(1, a_j))`` (a rank of one run costs
``attention(b - a, a)`` either way); everything else is ``MeasuredCost``'s. "per run" is the simulator's
model unchanged: its rows are ``cpkv simulate``'s owner-lane figures for the policy.

A what-if for reading the README's strategy figures, not a second cost model of the simulator: the trace
is replayed with ``cpkv.sim.engine.PolicyRun`` (owner-lane, one policy; C=8, P=64, the defaults of
``cpkv simulate``) once per strategy and pricing (``--quick``: the first 100 requests).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from _common import ROOT, parser, print_table, write_json

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
HEADER = ["strategy", "pricing", "finished", "TTFT p50 s", "TTFT p99 s", "compute_imbalance", "replay s"]


def one_call_cost(cp_size: int):
    """The measured model of a group of ``cp_size`` with a rank's runs priced as one call (module docstring)."""
    from cpkv.cost import MeasuredCost, MeasuredSpec

    class OneCallCost(MeasuredCost):
        def _attention(self, plan):
            owner, a, b = plan.position_runs()
            one = self.tables.attention(np.ones_like(a), a)  # [R] one query after each run's keys
            fixed = np.zeros(self.cp_size)
            np.maximum.at(
                fixed, owner, one
            )  # the call's cost at the rank's longest prefix (monotone in keys)
            work = self.tables.attention(b - a, a) - one
            return fixed + np.bincount(owner, weights=work, minlength=self.cp_size)

    return OneCallCost(MeasuredCost.load(MeasuredSpec(), cp_size).tables)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--max-requests", type=int, default=None, help="cap on trace lines (--quick: 100)")
    p.add_argument("--policy", default="balanced", help="owner policy (default balanced)")
    p.add_argument("--trace", type=Path, default=TRACE, help="trace (default: the shared Mooncake trace)")
    args = p.parse_args()
    from cpkv.cost import MeasuredSpec
    from cpkv.sim.config import SimConfig
    from cpkv.sim.cost import step_cost
    from cpkv.sim.engine import PolicyRun
    from cpkv.sim.workload import build_workload

    cap = args.max_requests or (100 if args.quick else None)
    spec = build_workload(
        "trace", num_requests=cap, seed=0, trace_path=args.trace, page_size=SimConfig.page_size
    )
    rows, figures = [], []
    for strategy in ("zigzag", "interleave"):
        config = SimConfig.for_workload(spec, measured=MeasuredSpec(), cp_strategy=strategy)
        for pricing, cost in (("per run", step_cost(config)), ("one call", one_call_cost(config.cp_size))):
            t0 = time.perf_counter()
            m = PolicyRun(config, args.policy, spec.requests, cost).run().metrics
            wall = time.perf_counter() - t0
            rows.append(
                [
                    strategy,
                    pricing,
                    f"{m['requests_finished']:,} of {m['requests_total']:,}",
                    m["ttft_ms_p50"] / 1000,
                    m["ttft_ms_p99"] / 1000,
                    m["compute_imbalance"],
                    wall,
                ]
            )
            figures.append(
                {
                    "cp_strategy": strategy,
                    "pricing": pricing,
                    "wall_s": wall,
                    **{
                        k: m[k]
                        for k in (
                            "requests_total",
                            "requests_finished",
                            "ttft_ms_p50",
                            "ttft_ms_p99",
                            "compute_imbalance",
                            "compute_imbalance_mean",
                        )
                    },
                }
            )
    print_table(
        f"owner-lane/{args.policy} on {args.trace.name} ({len(spec.requests):,} requests), C=8, P=64, "
        "measured H200 costs: a rank's runs priced per run (the simulator) or as one call",
        HEADER,
        rows,
    )
    write_json(
        args.json,
        {"benchmark": "interleave-pricing", "quick": args.quick, "policy": args.policy, "runs": figures},
    )


if __name__ == "__main__":
    main()
