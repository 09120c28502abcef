"""Per-rank work of one step: the illustrative ``CostModel`` and the choice of cost model (SPEC C-COST).

``step_cost(config)`` gives the simulator its ``cpkv.cost.StepCost``: ``IllustrativeCost`` (three
constants, the library default, see ``docs/metrics.md``) or, with ``SimConfig.measured`` set, the
measured model (``cpkv.cost.MeasuredCost``, aiconfigurator's tables; the ``cost`` extra).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from ..cost.step_cost import causal_pairs_per_rank
from ..planner import BatchPlan
from .config import CostModel, SimConfig

__all__ = ["IllustrativeCost", "causal_pairs_per_rank", "coverage", "step_cost", "step_work"]


def step_work(
    plan: BatchPlan | None, cost: CostModel, cp_size: int, decode_tokens: np.ndarray | None = None
) -> np.ndarray:
    """Work of each rank in one step, ms, float64 ``[C]``: linear term in tokens + causal-attention term.

    ``decode_tokens`` int ``[C]`` (colocated decode) adds linear work. The step time is
    ``cost.step_overhead_ms + work.max()``.
    """
    work = np.zeros(cp_size)
    if plan is not None and plan.num_tokens:
        work += (
            cost.linear_ms_per_token * plan.per_rank_tokens
            + cost.attn_ms_per_pair * causal_pairs_per_rank(plan)
        )
    if decode_tokens is not None:
        work += cost.linear_ms_per_token * decode_tokens
    return work


class IllustrativeCost:
    """``CostModel``'s three constants as a ``cpkv.cost.StepCost``: ``step_work`` as above, decode tokens
    (``decode.per_rank_tokens``) adding linear work, ``overhead_ms = cost.step_overhead_ms``.

    Args:
        cost: the constants. cp_size: ranks of the group (C).
    """

    def __init__(self, cost: CostModel, cp_size: int) -> None:
        self.cost, self.cp_size = cost, cp_size
        self.overhead_ms = cost.step_overhead_ms

    def step_work(self, prefill: BatchPlan | None, decode: BatchPlan | None = None) -> np.ndarray:
        """Work of each rank, float64 ``[C]`` ms (``step_work`` of the prefill plan and decode tokens)."""
        return step_work(prefill, self.cost, self.cp_size, None if decode is None else decode.per_rank_tokens)

    def provenance(self) -> dict:
        """``{"cost_model": "illustrative", <the three constants>}``."""
        return {"cost_model": "illustrative", **asdict(self.cost)}


def step_cost(config: SimConfig):
    """The ``StepCost`` of ``config``: ``IllustrativeCost`` unless ``config.measured`` names measurements.

    Raises:
        CostExtraMissing: measured, and aiconfigurator is not installed (``pip install '.[cost]'`` in a cpkv checkout).
        CostModelError: measured, and aiconfigurator cannot price the group.
    """
    if config.measured is None:
        return IllustrativeCost(config.cost, config.cp_size)
    from ..cost.measured import MeasuredCost

    return MeasuredCost.load(config.measured, config.cp_size)


def coverage(config: SimConfig, requests) -> dict:
    """The report's ``cost_provenance`` additions for ``config`` replaying ``requests``: ``error_band`` (the
    published accuracy of the tables behind the times, ``cost.coverage.ERROR_BAND``) and ``extrapolated``
    (what is priced past the installed measurements, ``cost.coverage.extrapolated``; empty when nothing, and
    always under the illustrative model)."""
    from ..cost import coverage as cov

    if config.measured is None:
        return {"error_band": cov.ILLUSTRATIVE_BAND, "extrapolated": []}
    longest = max((r.input_length for r in requests), default=0)
    return {
        "error_band": cov.ERROR_BAND,
        "extrapolated": cov.extrapolated(config.measured, config.cp_size, config.chunk_size, longest),
    }
