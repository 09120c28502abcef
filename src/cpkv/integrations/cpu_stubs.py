"""Import SGLang 0.5.23 on a CPU-only machine: a stand-in for ``torchvision`` (docs/sglang.md).

SGLang's multimodal code imports ``torchvision`` at module level, and no registry build of torchvision
imports with CPU torch 2.13 (0.28 and 0.29 fail with ``operator torchvision::nms does not exist``). The
allocator, ``RadixCache`` and the scheduler's allocation functions never call it, so inert modules can
take its place. This module imports neither sglang nor torchvision until ``install_torchvision_stub`` runs.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

TORCHVISION_MODULES = (
    "torchvision",
    "torchvision.io",
    "torchvision.ops",
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
)
"""The modules SGLang 0.5.23 and transformers 5.19 import from torchvision."""


class _Inert:
    """Any torchvision object touched at import time (a function, a class, an enum member)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __call__(self, *args, **kwargs):
        return _Inert()


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # transformers looks the spec up

    def __getattr__(attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Inert()

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


def install_torchvision_stub(version: str = "0.28.0") -> bool:
    """Put inert ``torchvision`` modules in ``sys.modules`` unless a working torchvision imports.

    Call it before the first ``import sglang``. A torchvision that fails to import (a build for another
    torch) is dropped from ``sys.modules`` first.

    Args:
        version: ``torchvision.__version__`` of the stub (transformers parses it), a version string.

    Returns:
        True when the stub was installed, False when the real torchvision imported.
    """
    try:
        import torchvision  # noqa: F401

        return False
    except Exception:  # ImportError, or the RuntimeError of a build for another torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    for name in TORCHVISION_MODULES:
        sys.modules[name] = _stub_module(name)
    sys.modules["torchvision"].__version__ = version  # type: ignore[attr-defined]
    return True
