"""Fixtures of the measured cost model's tests (``tests/cost_extra.py`` decides whether they run)."""

import pytest

from cost_extra import require_cost_extra


@pytest.fixture(scope="session")
def aic():
    """Skip (or, under CPKV_REQUIRE_COST=1, fail) unless aiconfigurator is installed."""
    require_cost_extra()


@pytest.fixture(scope="session")
def measured(aic):
    """``measured(cp_size)``: the default H200 / DeepSeek-V3.2 / SGLang ``MeasuredCost`` of that group."""
    from cpkv.cost import MeasuredCost, MeasuredSpec

    return lambda cp_size, **spec: MeasuredCost.load(MeasuredSpec(**spec), cp_size)
