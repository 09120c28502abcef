"""Per-rank work of one prefill step under the ``CostModel`` (see ``docs/metrics.md``)."""

from __future__ import annotations

import numpy as np

from ..planner import BatchPlan
from .config import CostModel


def causal_pairs_per_rank(plan: BatchPlan) -> np.ndarray:
    """Causal (query, key) pairs each rank computes, float64 ``[C]``, prefix keys included.

    A run of absolute positions ``[a, b)`` has queries ``q`` attending keys ``0..q``:
    ``sum_{q=a}^{b-1} (q + 1) = (b - a) * (a + b + 1) / 2``. Runs come from ``plan.token_runs``.
    Example P=1, C=2, L0=0, E=5 (owners 0,0,1,1,0): rank 0 runs [0,2) -> 3 and [4,5) -> 5: 8; rank 1 [2,4) -> 7.
    """
    runs = plan.token_runs
    C = plan.config.cp_size
    if runs.length.size == 0:
        return np.zeros(C)
    offset = np.cumsum(runs.length) - runs.length  # flat start of each run
    req_start = plan.extend_indptr[:-1][runs.req]
    a = (plan.prefix_lens[runs.req] + offset - req_start).astype(np.float64)
    b = a + runs.length
    pairs = runs.length * (a + b + 1) / 2
    return np.bincount(runs.owner, weights=pairs, minlength=C)


def step_work(
    plan: BatchPlan | None, cost: CostModel, cp_size: int, decode_tokens: np.ndarray | None = None
) -> np.ndarray:
    """Work of each rank in one step, ms, float64 ``[C]``: linear term in tokens + causal-attention term.

    ``decode_tokens`` int ``[C]`` (colocated decode) adds linear work. The step time is
    ``cost.step_overhead_ms + work.max()``.
    """
    work = np.zeros(cp_size)
    if plan is not None and plan.num_tokens:
        work += cost.linear_ms_per_token * plan.per_rank_tokens + cost.attn_ms_per_pair * causal_pairs_per_rank(plan)
    if decode_tokens is not None:
        work += cost.linear_ms_per_token * decode_tokens
    return work
