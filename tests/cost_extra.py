"""Whether the measured cost model's tests can run: they need aiconfigurator (the ``cost`` extra), skip
cleanly without it, except under ``CPKV_REQUIRE_COST=1`` (``make test``), where a missing extra fails them."""

import importlib.util
import os

import pytest


def _installed() -> bool:
    try:
        return importlib.util.find_spec("aiconfigurator_core") is not None
    except ImportError:  # a finder that refuses it (how tests imitate a library-only install)
        return False


INSTALLED = _installed()
REQUIRED = os.environ.get("CPKV_REQUIRE_COST") == "1"


def require_cost_extra() -> None:
    """Return when aiconfigurator is importable; else skip the test (fail it under CPKV_REQUIRE_COST=1)."""
    if INSTALLED:
        return
    if REQUIRED:
        pytest.fail("CPKV_REQUIRE_COST=1 but aiconfigurator is not installed (pip install 'cpkv[cost]')")
    pytest.skip("needs the cost extra (aiconfigurator): pip install 'cpkv[cost]'")
