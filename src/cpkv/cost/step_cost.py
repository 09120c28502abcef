"""The interface a scheduler prices its steps through (SPEC C-COST): one call per step, per-rank work back."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..planner import BatchPlan


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
