"""GPU kernels (Triton) that accelerate cpkv's numpy reference, with the same integers (SPEC C-KERNEL).

- ``fill_out_cache_loc(plan, last_locs, new_pages, device=, out=)``: a batch's ``out_cache_loc`` in one launch;
- ``read_slots`` / ``write_slots`` / ``owned_mask(layout, slots, ..., out=)``: C-LAYOUT on device tensors;
- ``all_gather_rerange(gathered, plan, out=)`` and ``all_gather_rerange_inverse(flat, plan, out=)``:
  the phase-aware gather-back (C-GATHER) and its inverse;
- ``require_kernel_version(minimum)``: the start-up version gate (Triton and cpkv's kernel ABI);
- ``kernel_backend(device)`` / ``use_kernels(device)``: the path a device takes, under ``CPKV_KERNELS``.

Importing this package never imports Triton (the optional ``gpu`` extra): the kernels load on first use
on a CUDA tensor, or on a CPU tensor under ``TRITON_INTERPRET=1`` (Triton's interpreter). Everything
else, and every function here on other devices, takes the numpy/torch reference path.
"""

from .backend import KERNEL_MODES, KERNELS_ENV, kernel_backend, kernel_mode, use_kernels
from .gate import INTERPRETER_MINIMUM, KERNEL_ABI, TRITON_MINIMUM, KernelStack, require_kernel_version
from .rerange import all_gather_rerange, all_gather_rerange_inverse
from .slots import fill_out_cache_loc, owned_mask, read_slots, write_slots

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
