"""Whether the tests of an optional extra can run: they need its package, skip cleanly without it, except
under its ``CPKV_REQUIRE_*=1`` variable (``make test`` sets them), where a missing extra fails them."""

import importlib.util
import os

import pytest


class OptionalExtra:
    """One optional extra: ``module`` it installs, the ``env`` variable that requires it, its pip name
    ``extra`` and how messages name it (``what``)."""

    def __init__(self, module: str, env: str, extra: str, what: str, skip: str) -> None:
        self.env, self.extra, self.what, self.skip = env, extra, what, skip
        try:
            self.installed = importlib.util.find_spec(module) is not None
        except ImportError:  # a finder that refuses it (how tests imitate a library-only install)
            self.installed = False
        self.required = os.environ.get(env) == "1"

    def require(self) -> None:
        """Return when the extra is importable; else skip the test (fail it under ``env=1``)."""
        if self.installed:
            return
        if self.required:
            pytest.fail(
                f"{self.env}=1 but {self.what} is not installed "
                f"(pip install '.[{self.extra}]' in a cpkv checkout)"
            )
        pytest.skip(f"{self.skip}: pip install '.[{self.extra}]' in a cpkv checkout")


COST = OptionalExtra(
    "aiconfigurator_core",
    "CPKV_REQUIRE_COST",
    "cost",
    "aiconfigurator",
    "needs the cost extra (aiconfigurator)",
)
"""The measured cost model's tests (``cost`` extra)."""
RAY = OptionalExtra("ray", "CPKV_REQUIRE_RAY", "ray", "Ray", "needs the ray extra")
"""The Ray executor's tests (``ray`` extra)."""
