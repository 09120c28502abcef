"""Whether the Ray executor's tests can run: they need Ray (the ``ray`` extra), skip cleanly without it,
except under ``CPKV_REQUIRE_RAY=1`` (``make test``), where a missing extra fails them."""

import importlib.util
import os

import pytest


def _installed() -> bool:
    try:
        return importlib.util.find_spec("ray") is not None
    except ImportError:  # a finder that refuses it
        return False


INSTALLED = _installed()
REQUIRED = os.environ.get("CPKV_REQUIRE_RAY") == "1"


def require_ray() -> None:
    """Return when Ray is importable; else skip the test (fail it under CPKV_REQUIRE_RAY=1)."""
    if INSTALLED:
        return
    if REQUIRED:
        pytest.fail("CPKV_REQUIRE_RAY=1 but Ray is not installed (pip install 'cpkv[ray]')")
    pytest.skip("needs the ray extra: pip install 'cpkv[ray]'")
