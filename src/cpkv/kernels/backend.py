"""Which path runs a kernel: compiled Triton, Triton's CPU interpreter, or the numpy/torch reference.

One switch, ``CPKV_KERNELS`` (``auto`` default, ``off``). Under ``auto``:
- tensors on a CUDA device run the compiled Triton kernels (after the version gate);
- CPU tensors run the same kernels in Triton's interpreter when ``TRITON_INTERPRET=1`` is set at call
  time (how CI checks the kernels without a GPU), else the numpy/torch reference path;
- any other device takes the reference path.
``off`` always takes the reference path (debugging; or a CUDA machine without Triton).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .gate import require_kernel_version

if TYPE_CHECKING:
    import torch

KERNELS_ENV = "CPKV_KERNELS"
KERNEL_MODES = ("auto", "off")
_TRUE = ("1", "true", "on", "yes")  # Triton's reading of a boolean environment variable


def kernel_mode() -> str:
    """``CPKV_KERNELS`` read now: ``"auto"`` (unset or empty) or ``"off"``, case and spaces ignored.

    Raises: ConfigError naming the variable and its value for anything else.
    """
    raw = os.environ.get(KERNELS_ENV, "auto")
    mode = raw.strip().lower() or "auto"
    if mode not in KERNEL_MODES:
        raise ConfigError(
            f"environment variable {KERNELS_ENV}={raw!r} is not a kernel mode; use one of {', '.join(KERNEL_MODES)}"
        )
    return mode


def interpreter_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter now (``1``, ``true``, ``on``, ``yes``)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def kernel_backend(device: torch.device | str) -> str:
    """The path for tensors on ``device``: ``"triton"``, ``"interpreter"`` or ``"torch"`` (see module doc).

    Raises:
        ConfigError: a bad ``CPKV_KERNELS``.
        KernelVersionError: a kernel path is chosen but Triton is missing or too old (the version gate).
    """
    if kernel_mode() == "off":
        return "torch"
    if isinstance(device, str) and device == "cpu":  # the common case, without importing torch
        kind = "cpu"
    else:
        import torch

        kind = torch.device(device).type
    if kind == "cuda":
        require_kernel_version()
        return "triton"
    if kind == "cpu" and interpreter_requested():
        require_kernel_version(interpreter=True)
        return "interpreter"
    return "torch"


def use_kernels(device: torch.device | str) -> bool:
    """True when tensors on ``device`` take a Triton path (``kernel_backend(device) != "torch"``).

    Callers read it once at start-up (e.g. ``OwnerLaneAllocator``), so a bad ``CPKV_KERNELS`` or a missing
    kernel stack fails there. Raises: as ``kernel_backend``.
    """
    return kernel_backend(device) != "torch"


@functools.cache
def kernel_module(interpret: bool) -> ModuleType:
    """``cpkv.kernels.triton_kernels`` built for the GPU (``interpret=False``) or for the interpreter.

    ``triton.jit`` picks compiled or interpreted when it decorates, from ``TRITON_INTERPRET``; so the
    module is executed once per variant with the variable set for it (and restored after). CUDA tensors
    thus always meet compiled kernels and CPU tensors interpreted ones, whatever the process environment.
    """
    name = f"{__package__}.triton_kernels"
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with cpkv
        raise ImportError(f"cannot find {name}")
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return module
