"""The Triton kernels of cpkv (SPEC C-KERNEL). Imports Triton: load it through
``cpkv.kernels.backend.kernel_module``, never directly (it builds a compiled and an interpreted variant).

Every kernel is integer index math plus loads and stores: no floating-point arithmetic, so the compiled
kernels, the interpreter and the numpy reference agree bit for bit. Positions and offsets are int64
(16M rows x 576 columns overflow int32). Divisions only ever see non-negative operands (negative slots
are clamped before and restored after), where Triton's truncating and numpy's flooring division agree.

Only builtins of ``triton.language`` (``tl.load``, ``tl.where``, ``tl.maximum``, ...) and this module's own
``@triton.jit`` helpers are used, never the jitted functions of ``triton.language.standard``
(``tl.zeros``, ``tl.zeros_like``, ``tl.cdiv``, ``tl.max``, ``tl.sum``, ...): those are decorated once, when
Triton is imported, in whichever mode ``TRITON_INTERPRET`` selected then, and would break the other
variant that ``kernel_module`` builds (e.g. the interpreted one in a process that imported Triton first).

Run tables (built on the host from the batch plan, O(runs), uploaded once) describe a map of row ranges:
run j covers ``[start[j], start[j+1])`` of the output (or ``[start[j], start[j] + length[j])``), with
``start`` strictly increasing. Each output element finds its run by a binary search over ``start``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _find_run(start_ptr, x, num_runs, n_iter):
    """Per element of ``x`` (int64): the largest j in ``[0, num_runs)`` with ``start[j] <= x``, or 0 when
    ``x < start[0]``. ``n_iter = ceil(log2(num_runs))`` halvings; every load index is in range.
    Example start [0, 2, 3], x [0, 1, 2, 5] -> [0, 0, 1, 2]."""
    lo = x * 0  # not tl.zeros_like: see the module note on triton.language.standard
    hi = lo + num_runs
    for _ in range(n_iter):
        mid = (lo + hi) // 2  # in [lo, hi): when hi == lo + 1, mid == lo and nothing changes
        go = tl.load(start_ptr + mid) <= x
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    return lo


@triton.jit
def fill_out_cache_loc_kernel(
    table_ptr, out_ptr, num_tokens, num_runs, num_blocks, n_iter, P: tl.constexpr, BLOCK: tl.constexpr
):
    """``out_cache_loc[t]`` for every extend token t of a batch, one launch (SPEC C-ALLOC, C-KERNEL).

    ``table`` int64 ``[2R + 1 + 4 num_blocks + num_pages]``: ``token_start [R + 1]`` (flat index of each
    run's first token, then the token count), ``base [R]``, per program ``[num_blocks, 4]`` the runs j0, j1
    of its first and last token and j0's token start and base, then ``new_pages``. A head run has
    ``base = last_loc + 1 >= 0`` and token k of it takes slot ``base + k``; a segment run has
    ``base = -(g + 1)`` with g the index of its first page in ``new_pages``, and token k takes
    ``new_pages[g + k // P] * P + k % P``.
    Example P=4, head run of 2 tokens with last_loc 9, then a segment of pages [5, 2] holding 6 tokens:
    table [0, 2, 8 | 10, -1 | 0, 1, 0, 10 | 5, 2] -> out [10, 11, 20, 21, 22, 23, 8, 9].

    A program whose tokens lie in one run (nearly all of a large batch: runs are long next to BLOCK)
    reads its run from its own table row, one load deep; only one that spans runs searches per token.
    A search for every token (n_iter dependent loads) kept the kernel latency-bound: 18 % of the peak
    memory bandwidth at 16M tokens on an H200, against 57 % now (benchmarks/README.md).
    """
    b = tl.program_id(0).to(tl.int64)
    t = b * BLOCK + tl.arange(0, BLOCK)
    mask = t < num_tokens
    row = table_ptr + 2 * num_runs + 1 + 4 * b
    j0 = tl.load(row)
    j1 = tl.load(row + 1)
    pages_ptr = table_ptr + 2 * num_runs + 1 + 4 * num_blocks
    if j0 == j1:
        _store_slots(pages_ptr, out_ptr, t, mask, t - tl.load(row + 2), tl.load(row + 3) + t * 0, P)
    else:
        j = _find_run(table_ptr, t, num_runs, n_iter)
        _store_slots(
            pages_ptr, out_ptr, t, mask, t - tl.load(table_ptr + j), tl.load(table_ptr + num_runs + 1 + j), P
        )


@triton.jit
def _store_slots(pages_ptr, out_ptr, t, mask, k, base, P: tl.constexpr):
    """Store the slots of tokens ``t`` (int64 ``[BLOCK]``, ``mask`` in range), each at offset ``k`` of a run
    whose base is ``base`` (``[BLOCK]``): ``fill_out_cache_loc_kernel``'s rule."""
    head = base >= 0
    page_idx = tl.where(head, 0, -base - 1) + k // P
    page = tl.load(pages_ptr + page_idx, mask=mask & (base < 0), other=0)
    slot = tl.where(head, base + k, page * P + (k - (k // P) * P))
    tl.store(out_ptr + t, slot, mask=mask)


@triton.jit
def translate_slots_kernel(
    src_ptr,
    dst_ptr,
    n,
    pages_per_lane,
    rank,
    C: tl.constexpr,
    P: tl.constexpr,
    KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """C-LAYOUT on ``n`` slots: KIND 0 write slot ``(p // C) * P + o``, 1 read slot ``((p % C) * Q + p // C)
    * P + o``, 2 owned mask ``s >= 0 and p % C == rank`` (stored as 0/1). Negative slots pass through
    (KIND 0, 1). Arithmetic in int64, stored in ``dst``'s dtype (the caller checked that results fit).
    Example C=4, P=64, Q=8, s=197: p=3, o=5 -> write 5, read (3*8 + 0)*64 + 5 = 1541.
    """
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    s = tl.load(src_ptr + i, mask=mask, other=0).to(tl.int64)
    pos = tl.maximum(s, 0)
    p = pos // P
    o = pos - p * P
    local = p // C
    lane = p - local * C
    if KIND == 0:
        res = tl.where(s >= 0, local * P + o, s)
    elif KIND == 1:
        res = tl.where(s >= 0, (lane * pages_per_lane + local) * P + o, s)
    else:
        res = ((s >= 0) & (lane == rank)).to(tl.int64)
    tl.store(dst_ptr + i, res.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def copy_runs_kernel(
    src_ptr,
    dst_ptr,
    table_ptr,
    num_rows,
    num_runs,
    n_iter,
    width,
    src_stride,
    dst_stride,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Row copy through a run map: ``dst[dst_start[j] + k] = src[src_start[j] + k]`` for k < length[j];
    rows of ``dst`` in no run are zeroed (the padding of each rank's M rows, SPEC C-GATHER).

    ``table`` int64 ``[3R]``: ``dst_start`` (strictly increasing) | ``src_start`` | ``length``. Rows hold
    ``width`` elements of any 1, 2, 4 or 8-byte type (the caller passes them as integers: a bit copy).
    Grid: (row blocks of BLOCK_R, column blocks of BLOCK_D).
    Example C=2, token owners [0, 0, 1, 1, 0], M=3, flat -> gathered: table [0, 2, 3 | 0, 4, 2 | 2, 1, 2]
    (runs: rows 0-1 from 0-1, row 2 from 4, rows 3-4 from 2-3), row 5 zero.
    """
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = _find_run(table_ptr, row, num_runs, n_iter)
    k = row - tl.load(table_ptr + j)
    length = tl.load(table_ptr + 2 * num_runs + j)
    inside = (k >= 0) & (k < length) & (row < num_rows)
    src_row = tl.load(table_ptr + num_runs + j) + k
    cmask = col < width
    vals = tl.load(
        src_ptr + src_row[:, None] * src_stride + col[None, :], mask=inside[:, None] & cmask[None, :], other=0
    )
    tl.store(
        dst_ptr + row[:, None] * dst_stride + col[None, :],
        vals,
        mask=(row < num_rows)[:, None] & cmask[None, :],
    )
