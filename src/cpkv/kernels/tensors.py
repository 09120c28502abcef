"""Tensor checks shared by the kernel entry points: ``out=`` buffers, device tensors, bit views."""

from __future__ import annotations

import contextlib

import torch

from ..errors import KernelError

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def require_tensor(name: str, x: object) -> torch.Tensor:
    """``x`` when it is a torch tensor, else KernelError naming ``name`` and the type."""
    if not isinstance(x, torch.Tensor):
        raise KernelError(f"{name} must be a torch tensor, got {type(x).__name__}")
    return x


def check_out(out, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """``out`` (or None) checked against the result it must hold.

    Raises: KernelError when ``out`` is not a contiguous tensor of exactly ``shape``, ``dtype`` and
    ``device``; the message names what was expected and what was given.
    """
    if out is None:
        return None
    out = require_tensor("out", out)
    if (
        tuple(out.shape) != tuple(shape)
        or out.dtype != dtype
        or not same_device(out.device, device)
        or not out.is_contiguous()
    ):
        raise KernelError(
            f"out must be a contiguous {dtype} tensor of shape {list(shape)} on {device}, got "
            f"{out.dtype} {list(out.shape)} on {out.device}{'' if out.is_contiguous() else ' (not contiguous)'}"
        )
    return out


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one: ``cuda`` without an index is the current CUDA device, so a tensor on
    ``cuda:0`` is on ``torch.device("cuda")`` while device 0 is current (as ``torch.empty(device="cuda")``)."""
    return _indexed(a) == _indexed(b)


def _indexed(d: torch.device) -> torch.device:
    """``d`` with the current CUDA device's index when it is ``cuda`` without one, else ``d``."""
    return torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d


def into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    """``result`` copied into ``out`` when ``out`` is given (already checked by ``check_out``), else itself."""
    return result if out is None else out.copy_(result)


def new_out(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """``out`` when given (already checked by ``check_out``), else a new empty tensor for the kernel to fill."""
    return out if out is not None else torch.empty(shape, dtype=dtype, device=device)


def on_device(x: torch.Tensor):
    """Context in which a Triton launch targets ``x``'s device: Triton launches on the current CUDA
    device, which need not be ``x``'s (a rank's ``cuda:3`` while device 0 is current)."""
    return torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for a >= 0, b >= 1: the number of programs of a grid."""
    return -(-a // b)


def bits_view(x: torch.Tensor) -> torch.Tensor | None:
    """``x`` viewed as the integer dtype of its element size (a bit copy moves it exactly), or None
    when there is none (elements of 16 bytes). Example: bfloat16 -> int16, float32 -> int32."""
    bits = _BITS.get(x.element_size())
    return None if bits is None else x.view(bits)
