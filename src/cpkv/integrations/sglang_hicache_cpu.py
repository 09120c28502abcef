"""SGLang 0.5.23 HiCache on a CPU-only machine: the three stand-ins it needs (tests and examples only).

SGLang's HiCache (``UnifiedRadixCache.init_hicache`` -> ``HybridCacheController`` over an
``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost``) runs on the CPU with ``io_backend="direct"`` once
(``shared/design/sglang-cp-integration.md`` section 1):

- host buffers are not pinned: SGLang's host pools default to ``pin_memory=True``, which registers the
  buffer with CUDA (``pool_host/common.py``);
- the ``direct`` copy ops exist: ``sgl_kernel.kvcacheio`` is imported only on CUDA/HIP/XPU, so on the CPU
  ``transfer_kv_direct`` (layer-first host layout) and ``transfer_kv_per_layer_direct_pf_lf`` /
  ``transfer_kv_all_layer_direct_lf_pf`` (``page_first_direct``, the layout Mooncake's L3 needs) are
  undefined names in ``pool_host/mha.py`` and ``pool_host/mla.py``; here they are torch index copies.

None of this is needed on a GPU, where SGLang's kernels run. The engine-side plugin
(``cpkv.integrations.sglang_hicache``) does not depend on it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size) -> None:
    """``dst[dst_indices] = src[src_indices]`` for each pair of layer buffers (rows ``[n, ...]``)."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)].to(dst.dtype)


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size
) -> None:
    """Host page-first (``[pages, layers, page_size, ...]`` per buffer) to device layer ``layer_id`` rows."""
    host = src_indices.cpu()
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        dst[dst_indices.to(dst.device)] = src[host // page_size, layer_id, host % page_size].to(dst.device)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size) -> None:
    """Device layers (K layers then V layers, or one list per host buffer) to host page-first buffers."""
    host = dst_indices.cpu()
    per_buffer = len(src_ptrs) // len(dst_ptrs)
    for b, dst in enumerate(dst_ptrs):
        for layer in range(per_buffer):
            src = src_ptrs[b * per_buffer + layer]
            dst[host // page_size, layer, host % page_size] = src[src_indices.to(src.device)].to(dst.device)


_OPS = {
    "transfer_kv_direct": transfer_kv_direct,
    "transfer_kv_per_layer_direct_pf_lf": transfer_kv_per_layer_direct_pf_lf,
    "transfer_kv_all_layer_direct_lf_pf": transfer_kv_all_layer_direct_lf_pf,
}


def install_hicache_cpu_standins() -> Callable[[], None]:
    """Install the stand-ins (module docstring) into SGLang's host-pool modules; returns the undo.

    Idempotent per call pair: the returned function restores exactly what this call replaced.
    """
    from sglang.srt.mem_cache.pool_host import mha, mla

    undo: list[tuple[object, str, object]] = []

    def put(owner, name, value):
        undo.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    for module in (mha, mla):
        for name, op in _OPS.items():
            put(module, name, op)
    for cls in (mha.MHATokenToKVPoolHost, mla.MLATokenToKVPoolHost):
        put(cls, "__init__", _unpinned(cls.__init__))

    def restore() -> None:
        for owner, name, old in reversed(undo):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        undo.clear()

    return restore


_MISSING = object()


def _unpinned(init):
    """``init`` with ``pin_memory=False`` forced (no CUDA host registration on the CPU)."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        kwargs["pin_memory"] = False
        return init(self, *args, **kwargs)

    return wrapper
