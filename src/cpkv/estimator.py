"""MQA-logits buffer estimate for the sparse-attention indexer (SPEC C-ESTIMATE)."""

from __future__ import annotations

import numpy as np

from .errors import PlanError
from .plan import BatchPlan, RequestPlan


def mqa_logits_elements(plan: BatchPlan | RequestPlan) -> np.ndarray:
    """Logits elements each rank's indexer materialises for this batch (SPEC C-ESTIMATE).

    For every maximal contiguous run of absolute positions ``[a, b)`` of one request that a rank
    computes, the rank holds a ``(b - a) x b`` block (each query row spans the causal keys up to the end
    of the run, prefix included). Runs come from the plan itself (``position_runs``), so each request's real
    phase and head owner are used (a phase-0 estimate under-sizes rotated ranks).

    Example C=2, P=1, L0=0, E=5: owners [0,0,1,1,0] -> runs rank0 [0,2) and [4,5), rank1 [2,4)
    -> rank 0: 2*2 + 1*5 = 9, rank 1: 2*4 = 8.

    Args:
        plan: a ``BatchPlan`` from ``plan_batch`` / the allocator, or a ``RequestPlan`` from ``plan_request``
            (SPEC section 10); a request plan gives the same estimate as its batch of one.

    Returns:
        ``[C]`` int64 elements per rank; the admission budget uses ``max()`` times the element bytes.

    Raises:
        TypeError: ``plan`` is neither a ``BatchPlan`` nor a ``RequestPlan``.
        PlanError: the estimate of one rank does not fit int64 (prefixes of ~1e13 tokens).
    """
    if isinstance(plan, BatchPlan):
        C = plan.config.cp_size
    elif isinstance(plan, RequestPlan):
        C = plan.per_rank_tokens.shape[0]
    else:
        raise TypeError(f"mqa_logits_elements needs a BatchPlan or a RequestPlan, got {type(plan).__name__}")
    owner, a, b = plan.position_runs()
    approx = np.bincount(owner, weights=np.multiply(b - a, b, dtype=np.float64), minlength=C)  # [C], C >= 1
    most = float(np.maximum.reduce(approx))
    if most >= 2.0**63:
        raise PlanError(f"MQA-logits estimate overflows int64: about {most:.3e} elements on one rank")
    if most >= 2.0**53:  # float sums may round: add exactly in int64
        out = np.zeros(C, dtype=np.int64)
        np.add.at(out, owner, (b - a) * b)
        return out
    return approx.astype(np.int64)  # integer terms and sums below 2**53: the float sums are exact
