"""Step prices of a CP group from measured operator latencies (SPEC C-COST).

``MeasuredCost.load(MeasuredSpec(), cp_size)`` prices each rank's work in a step from its own plan with
aiconfigurator's H200 / DeepSeek-V3.2 / SGLang measurements (the optional ``cost`` extra:
``pip install '.[cost]'`` in a cpkv checkout); ``.comm`` (``CommCost``) prices collectives and remote reads for other
models of the step (``allgather_ms``, ``reduce_scatter_ms``, ``allreduce_ms``, ``remote_read_ms``,
``p2p_ms``). See docs/cost-model.md. Names load on first use; aiconfigurator only when tables are built.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CommCost": ".comm",
    "MeasuredCost": ".measured",
    "BREAKDOWN": ".measured",
    "CostExtraMissing": ".spec",
    "CostModelError": ".spec",
    "MeasuredSpec": ".spec",
    "StepCost": ".step_cost",
    "PriceTables": ".tables",
    "price_tables": ".aic",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
