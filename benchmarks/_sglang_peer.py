"""SGLang 0.5.23's own allocator and radix cache, loaded on a CPU-only machine for bench_vs_sglang.py.

``load()`` returns the peer's classes, or the reason they cannot be imported (the benchmark then exits 0
with that message). What is stubbed, and only that: the ``torchvision`` package. SGLang's multimodal code
imports it at module level and no registry build of it imports with CPU torch 2.13; when a real
``torchvision`` does not import, inert modules stand in for ``torchvision``, ``.io``, ``.ops``,
``.transforms``, ``.transforms.functional``, ``.transforms.v2`` and ``.transforms.v2.functional`` (the root
with ``__version__ = "0.28.0"``, which transformers parses; every other attribute an inert object). The
allocator (``PagedTokenToKVPoolAllocator``, torch-native path because the CPU has no Triton) and the
radix cache (``RadixCache.create_simulated``: no KV pool, no request pool, LRU eviction) are SGLang's
unmodified code.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
import warnings

TORCHVISION_MODULES = (
    "torchvision",
    "torchvision.io",
    "torchvision.ops",
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
)


class _Inert:
    """Any torchvision object SGLang touches at import time; never called by the benchmark."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __call__(self, *args, **kwargs):
        return _Inert()


def _stub(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def __getattr__(attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Inert()

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


def stub_torchvision() -> bool:
    """Put inert ``torchvision`` modules in ``sys.modules`` unless a real one imports; True when stubbed."""
    try:
        import torchvision  # noqa: F401

        return False
    except Exception:  # ImportError, or the RuntimeError of a build made for another torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    for name in TORCHVISION_MODULES:
        sys.modules[name] = _stub(name)
    sys.modules["torchvision"].__version__ = "0.28.0"  # type: ignore[attr-defined]
    return True


def load() -> types.SimpleNamespace | str:
    """SGLang's classes as a namespace (``Allocator``, ``RadixCache``, ``RadixKey``, ``MatchPrefixParams``,
    ``InsertParams``, ``EvictParams``, ``version``, ``torchvision_stubbed``), or a one-line reason string
    when sglang is not installed or does not import."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not importable in this environment (see benchmarks/README.md: bench_vs_sglang.py)"
    stubbed = stub_torchvision()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
            from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from importlib.metadata import version
    except Exception as e:  # any import-time failure of the peer is reported, not raised
        return f"sglang does not import here: {type(e).__name__}: {e}"
    return types.SimpleNamespace(
        Allocator=PagedTokenToKVPoolAllocator, RadixCache=RadixCache, RadixKey=RadixKey,
        MatchPrefixParams=MatchPrefixParams, InsertParams=InsertParams, EvictParams=EvictParams,
        version=version("sglang"), torchvision_stubbed=stubbed,
    )  # fmt: skip
