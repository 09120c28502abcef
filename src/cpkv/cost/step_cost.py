"""The interface a scheduler prices its steps through (SPEC C-COST): one call per step, per-rank work back;
and the causal pairs of each rank's runs, which both cost models read."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..planner import BatchPlan


def causal_pairs_per_rank(plan: BatchPlan) -> np.ndarray:
    """Causal (query, key) pairs each rank computes, float64 ``[C]``, prefix keys included.

    A run of absolute positions ``[a, b)`` has queries ``q`` attending keys ``0..q``:
    ``sum_{q=a}^{b-1} (q + 1) = (b - a) * (a + b + 1) / 2``. Runs come from ``plan.position_runs()``.
    Example P=1, C=2, L0=0, E=5 (owners 0,0,1,1,0): rank 0 runs [0,2) -> 3 and [4,5) -> 5: 8; rank 1 [2,4) -> 7.
    """
    owner, a, b = plan.position_runs()
    pairs = (b - a) * (a + b + 1) / 2  # float64: exact below 2**53, as positions are (MAX_POSITION)
    return np.bincount(owner, weights=pairs, minlength=plan.config.cp_size)


class StepCost(Protocol):
    """A cost model of one CP group's steps (SPEC C-COST). ``cpkv.sim`` calls it once per step.

    A step lasts ``overhead_ms + max(step_work(prefill, decode))``: the slowest rank sets the pace.
    Implementations: ``cpkv.cost.MeasuredCost`` (aiconfigurator's measurements) and
    ``cpkv.sim.cost.IllustrativeCost`` (three constants, for tests).
    """

    overhead_ms: float
    """Fixed ms per step outside every rank's work."""

    def step_work(self, prefill: BatchPlan | None, decode: BatchPlan | None = None) -> np.ndarray:
        """Work of each rank in one step, float64 ``[C]`` ms.

        Args:
            prefill: the step's prefill batch plan (each rank's tokens and position runs), or None.
            decode: the step's decode batch plan (one token per request, or K with MTP; each token on the
                rank that owns its page), or None.
        """
        ...

    def provenance(self) -> dict:
        """JSON-ready description of the prices (model, GPU, engine, versions) for ``report.json``."""
        ...
