"""Fixtures of the measured cost model's tests (``tests/extras.py`` decides whether they run)."""

import pytest

from extras import COST


@pytest.fixture(scope="session")
def aic():
    """Skip (or, under CPKV_REQUIRE_COST=1, fail) unless aiconfigurator is installed."""
    COST.require()


@pytest.fixture(scope="session")
def measured(aic):
    """``measured(cp_size)``: the default H200 / DeepSeek-V3.2 / SGLang ``MeasuredCost`` of that group."""
    from cpkv.cost import MeasuredCost, MeasuredSpec

    return lambda cp_size, **spec: MeasuredCost.load(MeasuredSpec(**spec), cp_size)
