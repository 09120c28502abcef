"""SGLang 0.5.23 on the CPU for tests/integration/sglang (see /docs/sglang.md and ``make test-sglang``).

SGLang's multimodal code imports ``torchvision`` at module level, and no registry build of torchvision
imports with CPU torch 2.13 (``operator torchvision::nms does not exist``). When sglang is installed and
torchvision does not import, inert stub modules take its place before anything imports sglang: the root
with ``__version__`` (transformers parses it) and a spec (transformers looks it up), every other attribute
an inert object. Without sglang nothing is stubbed and the tests here skip (``pytest.importorskip``).

``CPKV_REQUIRE_SGLANG=1`` (set by ``make test-sglang``) turns a failing ``import sglang`` into a collection
error, so the SGLang tests can never all skip unnoticed in CI.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared workload helpers of this folder

_TORCHVISION_MODULES = (
    "torchvision",
    "torchvision.io",
    "torchvision.ops",
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
)


class _Inert:
    """Stands for any torchvision object SGLang touches at import time; never used by these tests."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __call__(self, *args, **kwargs):
        return _Inert()


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def __getattr__(attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Inert()

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


def _install_torchvision_stub() -> None:
    try:
        import torchvision  # noqa: F401

        return
    except Exception:  # ImportError, or the RuntimeError of a build made for another torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    for name in _TORCHVISION_MODULES:
        sys.modules[name] = _stub_module(name)
    sys.modules["torchvision"].__version__ = "0.28.0"  # type: ignore[attr-defined]


if importlib.util.find_spec("sglang") is not None:
    _install_torchvision_stub()

if os.environ.get("CPKV_REQUIRE_SGLANG") == "1":
    import cpkv.integrations.sglang  # noqa: F401  (fails collection loudly when SGLang does not import)
