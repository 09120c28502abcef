"""The phase-aware all-gather rerange (SPEC C-GATHER, C-KERNEL) and its inverse, on device tensors.

After an all-gather of the C ranks' buffers, each padded to ``M = plan.max_rank_tokens`` rows and
concatenated in rank order, ``all_gather_rerange`` puts the rows in flat (batch) order:
``flat[t] = gathered[plan.gather_index[t]]``. ``all_gather_rerange_inverse`` does the opposite, flat rows
into each rank's M rows, padding rows zero. Owners come from the plan (its token runs and gather index),
never from the zigzag rank ``z(s)`` of a segment: phases, head owners and the ``balanced`` policy are
honoured by construction. Rows may be of any width and of any 1, 2, 4 or 8-byte dtype (moved as bits).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import KernelError
from ..plan import BatchPlan
from .backend import kernel_backend, kernel_module
from .tensors import bits_view, cdiv, check_out, into, new_out, on_device, require_tensor

_TILE = {"triton": 4096, "interpreter": 32768}  # elements per program (BLOCK_R rows x BLOCK_D columns);
# the interpreter's cost is per program (milliseconds each), so it takes bigger tiles


def all_gather_rerange(gathered: torch.Tensor, plan: BatchPlan, *, out=None) -> torch.Tensor:
    """Gathered rows ``[C*M, D]`` (rank r's rows at ``r*M ..``) -> the batch in flat order ``[N, D]`` (C-GATHER).

    Equals ``gathered[plan.gather_index]`` bit for bit. Example C=2, token owners [0, 0, 1, 1, 0] (M=3,
    gather_index [0, 1, 3, 4, 2]): gathered rows [a, b, e, c, d, pad] -> [a, b, c, d, e].

    Args:
        gathered: ``[C*M, D]`` tensor of any 1/2/4/8-byte dtype (fp32, bf16, fp16, fp8, int...), on any
            device; rows with ``stride(1) == 1`` are read in place (any row stride), others copied first.
        plan: the ``BatchPlan`` of the forward (its ``token_runs``, ``gather_index``, ``max_rank_tokens``).
        out: optional contiguous ``[N, D]`` tensor of the same dtype and device to write into.

    Returns:
        ``[N, D]``, same dtype and device (``out`` when given); N = ``plan.num_tokens``.

    Raises:
        KernelError: ``gathered`` not 2-D with ``C*M`` rows, or an ``out`` that does not fit.
        ConfigError, KernelVersionError: as ``kernel_backend``.
    """
    gathered = _rows("gathered", gathered, plan, plan.config.cp_size * plan.max_rank_tokens)
    shape = (plan.num_tokens, gathered.shape[1])
    out = check_out(out, shape, gathered.dtype, gathered.device)
    backend = kernel_backend(gathered.device)
    if backend == "torch" or bits_view(gathered) is None:
        return into(out, gathered.index_select(0, _gather_index(plan, gathered.device)))
    flat_start, length = _flat_runs(plan)
    table = np.concatenate([flat_start, plan.gather_index[flat_start], length])  # dst (flat) | src | length
    return _copy_runs(backend, gathered, new_out(out, shape, gathered.dtype, gathered.device), table)


def all_gather_rerange_inverse(flat: torch.Tensor, plan: BatchPlan, *, out=None) -> torch.Tensor:
    """Flat rows ``[N, D]`` -> each rank's rows in rank order, padded to M: ``[C*M, D]`` (C-GATHER inverse).

    Row ``gather_index[t]`` gets ``flat[t]``; the padding rows (``r*M + n_r .. (r+1)*M - 1``) are zero.
    Equals ``zeros(C*M, D).index_copy_(0, gather_index, flat)`` bit for bit. Example C=2, owners
    [0, 0, 1, 1, 0]: [a, b, c, d, e] -> [a, b, e, c, d, 0].

    Args:
        flat: ``[N, D]`` tensor (N = ``plan.num_tokens``), any 1/2/4/8-byte dtype, as ``gathered`` above.
        plan: the ``BatchPlan`` of the forward.
        out: optional contiguous ``[C*M, D]`` tensor of the same dtype and device to write into.

    Returns: ``[C*M, D]``, same dtype and device. Raises: as ``all_gather_rerange``.
    """
    flat = _rows("flat", flat, plan, plan.num_tokens)
    shape = (plan.config.cp_size * plan.max_rank_tokens, flat.shape[1])
    out = check_out(out, shape, flat.dtype, flat.device)
    backend = kernel_backend(flat.device)
    if backend == "torch" or bits_view(flat) is None:
        zeros = torch.zeros(shape, dtype=flat.dtype, device=flat.device)
        return into(out, zeros.index_copy_(0, _gather_index(plan, flat.device), flat))
    flat_start, length = _flat_runs(plan)
    rank_start = plan.gather_index[flat_start]
    order = np.argsort(rank_start, kind="stable")  # the kernel searches the destination starts
    table = np.concatenate(
        [rank_start[order], flat_start[order], length[order]]
    )  # dst (rank rows) | src | length
    return _copy_runs(backend, flat, new_out(out, shape, flat.dtype, flat.device), table)


def _rows(name: str, x, plan: BatchPlan, rows: int) -> torch.Tensor:
    """``x`` checked as a 2-D tensor of ``rows`` rows with contiguous rows; KernelError naming ``name``."""
    if not isinstance(plan, BatchPlan):
        raise KernelError(f"plan must be a BatchPlan, got {type(plan).__name__}")
    x = require_tensor(name, x)
    if x.dim() != 2 or x.shape[0] != rows:
        raise KernelError(
            f"{name} must be 2-D with {rows} rows (cp_size={plan.config.cp_size}, max_rank_tokens="
            f"{plan.max_rank_tokens}, tokens={plan.num_tokens}), got shape {list(x.shape)}"
        )
    return x if x.shape[1] <= 1 or x.stride(1) == 1 else x.contiguous()


def _flat_runs(plan: BatchPlan) -> tuple[np.ndarray, np.ndarray]:
    """``(flat_start, length)`` int64 ``[R]`` of the plan's token runs: each run is one owner's, so its rows
    are consecutive both in flat order and in the owner's rows (``gather_index`` rises by 1 along it)."""
    length = plan.token_runs.length
    return np.cumsum(length) - length, length


def _gather_index(plan: BatchPlan, device: torch.device) -> torch.Tensor:
    """``plan.gather_index`` as a torch.int64 tensor on ``device`` (the torch index-op path)."""
    return torch.tensor(plan.gather_index, dtype=torch.int64, device=device)


def _copy_runs(backend: str, src: torch.Tensor, dst: torch.Tensor, table: np.ndarray) -> torch.Tensor:
    """Launch ``copy_runs_kernel`` over all rows of ``dst`` (rows in no run are zeroed); returns ``dst``."""
    rows, width = dst.shape
    if rows == 0 or width == 0:
        return dst
    num_runs = table.shape[0] // 3
    block_d = min(1 << (width - 1).bit_length(), 128)
    block_r = _TILE[backend] // block_d
    grid = (cdiv(rows, block_r), cdiv(width, block_d))
    with on_device(dst):
        kernel_module(backend == "interpreter").copy_runs_kernel[grid](
            bits_view(src),
            bits_view(dst),
            torch.from_numpy(table).to(dst.device),
            rows,
            num_runs,
            max(num_runs - 1, 0).bit_length(),
            width,
            src.stride(0),
            dst.stride(0),
            BLOCK_R=block_r,
            BLOCK_D=block_d,
        )
    return dst
