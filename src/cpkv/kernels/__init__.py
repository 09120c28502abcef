"""GPU kernels (Triton) that accelerate cpkv's numpy reference, with the same integers (SPEC C-KERNEL).

- ``fill_out_cache_loc(plan, last_locs, new_pages, device=, out=)``: a batch's ``out_cache_loc`` in one launch;
- ``read_slots`` / ``write_slots`` / ``owned_mask(layout, slots, ..., out=)``: C-LAYOUT on device tensors;
- ``all_gather_rerange(gathered, plan, out=)`` and ``all_gather_rerange_inverse(flat, plan, out=)``:
  the phase-aware gather-back (C-GATHER) and its inverse;
- ``require_kernel_version(minimum)``: the start-up version gate (Triton and cpkv's kernel ABI);
- ``kernel_backend(device)`` / ``use_kernels(device)``: the path a device takes, under ``CPKV_KERNELS``.

Importing this package never imports Triton (the optional ``gpu`` extra), nor torch: names load on first
use (PEP 562), and only ``rerange`` and ``slots`` need torch. The kernels load on first use
on a CUDA tensor, or on a CPU tensor under ``TRITON_INTERPRET=1`` (Triton's interpreter). Everything
else, and every function here on other devices, takes the numpy/torch reference path.
"""

from __future__ import annotations

import importlib

_EXPORTS = {  # public name -> the submodule that defines it (loaded on first use: torch only with rerange, slots)
    "KERNEL_MODES": "backend",
    "KERNELS_ENV": "backend",
    "kernel_backend": "backend",
    "kernel_mode": "backend",
    "use_kernels": "backend",
    "INTERPRETER_MINIMUM": "gate",
    "KERNEL_ABI": "gate",
    "TRITON_MINIMUM": "gate",
    "KernelStack": "gate",
    "require_kernel_version": "gate",
    "all_gather_rerange": "rerange",
    "all_gather_rerange_inverse": "rerange",
    "fill_out_cache_loc": "slots",
    "owned_mask": "slots",
    "read_slots": "slots",
    "write_slots": "slots",
}

__all__ = [
    "INTERPRETER_MINIMUM",
    "KERNELS_ENV",
    "KERNEL_ABI",
    "KERNEL_MODES",
    "TRITON_MINIMUM",
    "KernelStack",
    "all_gather_rerange",
    "all_gather_rerange_inverse",
    "fill_out_cache_loc",
    "kernel_backend",
    "kernel_mode",
    "owned_mask",
    "read_slots",
    "require_kernel_version",
    "use_kernels",
    "write_slots",
]


def __getattr__(name: str):
    """Load a public name from its submodule on first access (``from cpkv.kernels import X`` included)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
