"""The measured cost model's tests need aiconfigurator (the ``cost`` extra): they skip cleanly without it,
except under ``CPKV_REQUIRE_COST=1`` (``make test``), where a missing extra fails them."""

import importlib.util
import os

import pytest


@pytest.fixture(scope="session")
def aic():
    """Skip (or, under CPKV_REQUIRE_COST=1, fail) unless aiconfigurator is installed."""
    if importlib.util.find_spec("aiconfigurator_core") is None:
        if os.environ.get("CPKV_REQUIRE_COST") == "1":
            pytest.fail("CPKV_REQUIRE_COST=1 but aiconfigurator is not installed (pip install 'cpkv[cost]')")
        pytest.skip("needs the cost extra (aiconfigurator): pip install 'cpkv[cost]'")


@pytest.fixture(scope="session")
def measured(aic):
    """``measured(cp_size)``: the default H200 / DeepSeek-V3.2 / SGLang ``MeasuredCost`` of that group."""
    from cpkv.cost import MeasuredCost, MeasuredSpec

    return lambda cp_size, **spec: MeasuredCost.load(MeasuredSpec(**spec), cp_size)
