"""Slot kernels on device tensors: ``out_cache_loc`` of a batch, and the C-LAYOUT translations.

Each function gives exactly the integers of the numpy reference (``slots.extend_slots`` for
``out_cache_loc``, ``SharedKVLayout``) and takes the path ``kernel_backend`` picks for its device:
compiled Triton on CUDA, Triton's interpreter on the CPU under ``TRITON_INTERPRET=1``, else the reference.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import KernelError
from ..layout import SharedKVLayout
from ..plan import BatchPlan
from ..slots import extend_slots
from ..validate import as_int_array
from .backend import kernel_backend, kernel_module
from .tensors import cdiv, check_out, into, new_out, on_device, require_tensor

_BLOCK = 1024  # tokens or slots per Triton program
_KIND = {"write_slots": 0, "read_slots": 1, "owned_mask": 2}
_KERNEL_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def fill_out_cache_loc(
    plan: BatchPlan, last_locs, new_pages, *, device: torch.device | str | None = None, out=None
) -> torch.Tensor:
    """``out_cache_loc`` of a planned and allocated batch, written on the device in one launch (C-KERNEL).

    The same integers as ``OwnerLaneAllocator.alloc_extend`` (SPEC section 7): per request, head tokens
    take ``last_loc + 1, ...``, then each new page p gives ``p*P + 0 .. P-1``, the last page only as far
    as ``prefix_len + extend_len``. The kernel reads the plan's run-length form (``plan.token_runs``, at
    most ``B * (2C + 1)`` runs under zigzag, one per head and page under interleave) and the pages: one host-to-device copy of ``2R + 1 + 4 nb + sum m`` int64
    (nb programs of 1,024 tokens).
    Example P=4, one request L0=10, E=8, last_loc 9, pages [5, 2]: [10, 11, 20, 21, 22, 23, 8, 9].

    Args:
        plan: the ``BatchPlan`` the pages were allocated for (``ExtendAllocation.plan``).
        last_locs: ``[B]`` ints, slot of each request's position ``prefix_len - 1`` (-1 without prefix).
        new_pages: ``[sum m]`` ints, the allocated pages in ``plan.page_owners`` order (numpy or CPU tensor).
        device: where the result lives (default: ``out``'s device, else CPU).
        out: optional contiguous int64 tensor ``[sum E]`` on ``device`` to write into.

    Returns:
        ``[sum E]`` torch.int64 on ``device`` (``out`` when given).

    Raises:
        KernelError: ``last_locs`` or ``new_pages`` of the wrong length, a request with head tokens and a
            negative ``last_loc``, or an ``out`` that does not fit.
        ConfigError, KernelVersionError: as ``kernel_backend``.
    """
    if not isinstance(plan, BatchPlan):
        raise KernelError(f"plan must be a BatchPlan, got {type(plan).__name__}")
    last = as_int_array("last_locs", last_locs, plan.num_requests, error=KernelError, count_of="the plan")
    pages = as_int_array(
        "new_pages", new_pages, plan.page_owners.shape[0], error=KernelError, count_of="the plan"
    )
    dev = torch.device(
        device if device is not None else out.device if isinstance(out, torch.Tensor) else "cpu"
    )
    out = check_out(out, (plan.num_tokens,), torch.int64, dev)
    runs = plan.token_runs
    head = runs.pages == 0  # head runs have no new page; every segment run has at least one
    bad = np.flatnonzero(head & (last[runs.req] < 0))
    if bad.size:
        i = int(runs.req[bad[0]])
        raise KernelError(
            f"request {i}: computes head tokens but last_loc={int(last[i])} (needs a slot >= 0)"
        )
    backend = kernel_backend(dev)
    if backend == "torch" or plan.num_tokens == 0:
        return into(out, torch.from_numpy(extend_slots(plan, last, pages)).to(dev))
    result = new_out(out, (plan.num_tokens,), torch.int64, dev)
    return launch_fill(backend, torch.from_numpy(fill_table(plan, last, pages)).to(dev), result, plan)


def fill_table(plan: BatchPlan, last: np.ndarray, pages: np.ndarray) -> np.ndarray:
    """The run table of ``fill_out_cache_loc_kernel``, int64 ``[2R + 1 + 4 nb + sum m]``: token starts
    ``[R + 1]``, bases ``[R]`` (``last_loc + 1`` for a head run, ``-(g + 1)`` for a segment run whose first
    page is ``pages[g]``), per ``_BLOCK``-token program ``[nb, 4]`` (``nb = ceil(sum E / _BLOCK)``): the runs
    j0, j1 of its first and last token, j0's token start and base; then ``pages``. O(R + nb log R + pages)
    numpy. Inputs as checked by ``fill_out_cache_loc``. Example C=1, P=4, L0=10, E=8, last_loc 9, pages
    [5, 2]: runs (head, 2 tokens), (segment, 4 tokens from page 5), (segment, 2 from page 2), one
    program over runs 0..2 -> [0, 2, 6, 8 | 10, -1, -2 | 0, 2, 0, 10 | 5, 2].
    """
    runs = plan.token_runs
    R = runs.length.shape[0]
    nb = cdiv(plan.num_tokens, _BLOCK)
    table = np.empty(2 * R + 1 + 4 * nb + pages.shape[0], dtype=np.int64)
    table[0] = 0
    np.cumsum(runs.length, out=table[1 : R + 1])
    first_page = np.cumsum(runs.pages) - runs.pages  # index in pages of each segment run's first page
    table[R + 1 : 2 * R + 1] = np.where(runs.pages == 0, last[runs.req] + 1, -first_page - 1)
    ends = np.arange(nb, dtype=np.int64)[:, None] * _BLOCK + [0, _BLOCK - 1]  # first and last token
    np.minimum(ends, plan.num_tokens - 1, out=ends)
    rows = table[2 * R + 1 : 2 * R + 1 + 4 * nb].reshape(nb, 4)
    rows[:, :2] = np.searchsorted(table[:R], ends, "right") - 1
    rows[:, 2] = table[rows[:, 0]]
    rows[:, 3] = table[R + 1 + rows[:, 0]]
    table[2 * R + 1 + 4 * nb :] = pages
    return table


def launch_fill(backend: str, table: torch.Tensor, out: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
    """One launch of ``fill_out_cache_loc_kernel`` writing ``out`` (int64 ``[sum E]``, ``sum E > 0``) from
    ``table`` (``fill_table``'s, on ``out``'s device); ``backend`` "triton" or "interpreter". Returns ``out``."""
    R = plan.token_runs.length.shape[0]
    nb = cdiv(plan.num_tokens, _BLOCK)
    with on_device(out):
        kernel_module(backend == "interpreter").fill_out_cache_loc_kernel[(nb,)](
            table, out, plan.num_tokens, R, nb, (R - 1).bit_length(), P=plan.config.page_size, BLOCK=_BLOCK
        )
    return out


def read_slots(layout: SharedKVLayout, slots: torch.Tensor, *, out=None, check: bool = True) -> torch.Tensor:
    """Rank-major read slot of each slot, ``((p % C) * Q + p // C) * P + o`` (C-LAYOUT), on the device.

    Equals ``layout.read_slots(slots)``: same dtype, shape and device; negative slots pass through.
    Example C=4, P=64, Q=8: ``[0, 63, 64, 65, 128, 197, 512, -1]`` -> ``[0, 63, 512, 513, 1024, 1541, 128, -1]``.

    Args:
        layout: the ``SharedKVLayout`` (C, P, Q).
        slots: integer tensor of any shape (slots).
        out: optional contiguous tensor of the same shape, dtype and device to write into.
        check: verify ``slots < C*Q*P`` first: on the host a LayoutError naming the slot; on a CUDA device
            one reduction and a device-side assert queued on the stream (no sync: an out-of-range slot fails
            the stream at the next sync, fatal to the CUDA context); ``False`` skips it for slots known to
            be in range (out-of-range slots then give meaningless rows).

    Raises: LayoutError as ``layout.read_slots``; KernelError for a non-tensor or an ``out`` that does not fit.
    """
    return _translate(layout, "read_slots", slots, None, out, check)


def write_slots(layout: SharedKVLayout, slots: torch.Tensor, *, out=None, check: bool = True) -> torch.Tensor:
    """Row of each slot in its owner's lane buffer, ``(p // C) * P + o`` (C-LAYOUT, direct write), on the device.

    Equals ``layout.write_slots(slots)``; arguments and errors as ``read_slots``.
    Example C=4, P=64, Q=8: ``[0, 63, 64, 65, 128, 197, 512, -1]`` -> ``[0, 63, 0, 1, 0, 5, 128, -1]``.
    """
    return _translate(layout, "write_slots", slots, None, out, check)


def owned_mask(
    layout: SharedKVLayout, slots: torch.Tensor, rank: int, *, out=None, check: bool = True
) -> torch.Tensor:
    """Bool tensor, same shape and device: ``slot >= 0 and (slot // P) % C == rank`` (C-LAYOUT).

    Equals ``layout.owned_mask(slots, rank)``; ``out`` must be a bool tensor. Example C=4, P=64, rank 2:
    ``[0, 63, 64, 65, 128, 197, 512, -1]`` -> ``[F, F, F, F, T, F, F, F]``.

    Raises: LayoutError for ``rank`` outside ``[0, C)`` or bad slots; KernelError as ``read_slots``.
    """
    if isinstance(rank, bool) or not hasattr(rank, "__index__") or not 0 <= int(rank) < layout.cp_size:
        return layout.owned_mask(slots, rank)  # raises the reference's LayoutError
    return _translate(layout, "owned_mask", slots, int(rank), out, check)


def _translate(layout: SharedKVLayout, kind: str, slots, rank: int | None, out, check: bool) -> torch.Tensor:
    """One C-LAYOUT translation through the kernel, or through the reference where the kernel does not
    apply: the torch path, a dtype Triton cannot load, one that cannot hold every possible result, or a
    replicated pool (C-POOL: the slot itself, and owner translations raise ``PoolKindError``)."""
    slots = require_tensor("slots", slots)
    if not isinstance(layout, SharedKVLayout):
        raise KernelError(f"layout must be a SharedKVLayout, got {type(layout).__name__}")
    dtype = torch.bool if kind == "owned_mask" else slots.dtype
    out = check_out(out, tuple(slots.shape), dtype, slots.device)
    reference = layout.owned_mask if kind == "owned_mask" else getattr(layout, kind)
    args = (rank,) if kind == "owned_mask" else ()
    fits = slots.dtype in _KERNEL_DTYPES and (
        kind == "owned_mask" or torch.iinfo(slots.dtype).max >= layout.num_slots - 1
    )
    backend = kernel_backend(slots.device)
    if backend == "torch" or not fits or layout.kind != "sharded":  # a replicated pool has no owners (C-POOL)
        return into(out, reference(slots, *args, check=check))
    n = slots.numel()
    if check and n:
        layout.check_slots(slots)  # the reference's LayoutError on the host; queued on a CUDA device
    result = new_out(out, tuple(slots.shape), dtype, slots.device)
    if n == 0:
        return result
    dst = result.view(-1).view(torch.uint8) if kind == "owned_mask" else result.view(-1)
    with on_device(dst):
        kernel_module(backend == "interpreter").translate_slots_kernel[(cdiv(n, _BLOCK),)](
            slots.contiguous().view(-1),
            dst,
            n,
            layout.pages_per_lane,
            -1 if rank is None else rank,
            C=layout.cp_size,
            P=layout.page_size,
            KIND=_KIND[kind],
            BLOCK=_BLOCK,
        )
    return result
