"""SGLang 0.5.23's own allocator and radix cache, loaded on a CPU-only machine for bench_vs_sglang.py.

``load()`` returns the peer's classes, or the reason they cannot be imported (the benchmark then exits 0
with that message). What is stubbed, and only that: the ``torchvision`` package. SGLang's multimodal code
imports it at module level and no registry build of it imports with CPU torch 2.13; when a real
``torchvision`` does not import, inert modules stand in for ``torchvision``, ``.io``, ``.ops``,
``.transforms``, ``.transforms.functional``, ``.transforms.v2`` and ``.transforms.v2.functional`` (the root
with ``__version__ = "0.28.0"``, which transformers parses; every other attribute an inert object;
``cpkv.integrations.cpu_stubs``, shared with the SGLang integration tests). The
allocator (``PagedTokenToKVPoolAllocator``, torch-native path because the CPU has no Triton) and the
radix cache (``RadixCache.create_simulated``: no KV pool, no request pool, LRU eviction) are SGLang's
unmodified code.
"""

from __future__ import annotations

import importlib.util
import types
import warnings

from cpkv.integrations.cpu_stubs import install_torchvision_stub


def load() -> types.SimpleNamespace | str:
    """SGLang's classes as a namespace (``Allocator``, ``PageInterleaveAllocator``, ``RadixCache``, ``RadixKey``, ``MatchPrefixParams``,
    ``InsertParams``, ``EvictParams``, ``version``, ``torchvision_stubbed``), or a one-line reason string
    when sglang is not installed or does not import."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not importable in this environment (see benchmarks/README.md: bench_vs_sglang.py)"
    stubbed = install_torchvision_stub()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt.mem_cache.allocator.page_interleave import PageInterleavePoolAllocator
            from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
            from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from importlib.metadata import version
    except Exception as e:  # any import-time failure of the peer is reported, not raised
        return f"sglang does not import here: {type(e).__name__}: {e}"
    return types.SimpleNamespace(
        Allocator=PagedTokenToKVPoolAllocator,
        PageInterleaveAllocator=PageInterleavePoolAllocator,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
        MatchPrefixParams=MatchPrefixParams,
        InsertParams=InsertParams,
        EvictParams=EvictParams,
        version=version("sglang"),
        torchvision_stubbed=stubbed,
    )
