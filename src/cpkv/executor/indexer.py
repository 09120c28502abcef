"""The lightning indexer's arithmetic and sparse MLA, shared by the CP ranks and the reference (SPEC C-NSA).

Pure functions of tensors, in float32, with no pages, slots or plan: the executor feeds them rows read
through the rank-major view of the paged pools, the single-process reference feeds them contiguous rows.
Both therefore run the same arithmetic in the same order:

- ``index_logits``: ``I[t, s] = sum_h w[t, h] * ReLU(q_I[t, h] . k_I[s])``, heads summed in order 0..H-1;
- ``mask_causal``: keys after a query's position get ``-inf``;
- ``select_topk``: the ``min(k, p + 1)`` largest logits of a row, ties to the lower position, positions
  sorted ascending and padded with -1 to k;
- ``near_ties``: rows whose k-th and (k+1)-th largest logits are within 1e-6 relative (a top-k choice there
  may legitimately differ between two float32 runs);
- ``sparse_mla``: softmax over the selected latent rows only (-1 entries skipped), per query chunk so the
  gathered rows stay small.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NEAR_TIE_RTOL = 1e-6
"""Relative gap under which the k-th and (k+1)-th logits of a row count as tied (SPEC C-NSA)."""

SPARSE_ROWS_BUDGET = 1 << 24
"""Most gathered latent floats per query chunk of ``sparse_mla`` (64 MiB of float32)."""


def index_logits(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Index logits of queries against keys (SPEC C-NSA), before any causal mask.

    Args:
        q: ``[n, H, D]`` float32 index queries ``q_I`` of n tokens.
        w: ``[n, H]`` float32 per-head gate weights.
        k: ``[b, D]`` float32 index keys ``k_I`` of key positions ``0 .. b-1``.

    Returns:
        ``[n, b]`` float32 ``sum_h w[:, h] * ReLU(q[:, h] @ k.T)``; this is the materialised logits block
        (its ``numel()`` is what a rank counts against C-ESTIMATE).
    """
    out = torch.zeros(q.shape[0], k.shape[0], dtype=torch.float32, device=q.device)
    kt = k.T
    for h in range(q.shape[1]):
        out.add_(torch.relu(q[:, h] @ kt).mul_(w[:, h, None]))
    return out


def mask_causal(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Set ``logits[t, s] = -inf`` where key position ``s > positions[t]`` (in place; returns ``logits``).

    Args: ``logits [n, b]`` float32 over keys ``0 .. b-1``; ``positions [n]`` int64, each ``< b``.
    """
    keys = torch.arange(logits.shape[1], device=logits.device)
    return logits.masked_fill_(keys[None, :] > positions[:, None], float("-inf"))


def select_topk(logits: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k key positions of each row (SPEC C-NSA): ties to the lower position, ascending, -1 padded.

    Args:
        logits: ``[n, b]`` float32, causally masked (``mask_causal``), keys ``0 .. b-1``.
        positions: ``[n]`` int64 query positions (``< b``); row t keeps ``min(k, positions[t] + 1)`` keys.
        k: index_topk (>= 1).

    Returns:
        ``[n, k]`` int64: the kept positions in ascending order, then -1.
    """
    n, b = logits.shape
    kk = min(k, b)
    # A stable descending sort keeps equal logits in position order: ties go to the lower position.
    order = torch.sort(logits, dim=1, descending=True, stable=True).indices[:, :kk]
    count = (positions + 1).clamp(max=k)  # [n] keys kept per row (<= kk: positions < b)
    keep = torch.arange(kk, device=logits.device)[None, :] < count[:, None]
    picked = torch.sort(torch.where(keep, order, b), dim=1).values  # b: sentinel, sorts last
    picked[picked == b] = -1
    out = torch.full((n, k), -1, dtype=torch.int64, device=logits.device)
    out[:, :kk] = picked
    return out


def near_ties(logits: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """Rows whose k-th and (k+1)-th largest logits are within ``NEAR_TIE_RTOL`` relative, ``[n]`` bool.

    Only rows that see more than k keys (``positions + 1 > k``) can be tied; the others keep every key.
    Args as ``select_topk``.
    """
    n, b = logits.shape
    if k >= b:
        return torch.zeros(n, dtype=torch.bool, device=logits.device)
    top = torch.topk(logits, k + 1, dim=1).values  # [n, k+1] descending
    kth, nxt = top[:, k - 1], top[:, k]
    tied = (kth - nxt).abs() <= NEAR_TIE_RTOL * torch.maximum(kth.abs(), nxt.abs())
    return tied & (positions + 1 > k)


def sparse_mla(
    q: torch.Tensor,
    topk: torch.Tensor,
    read_rows: Callable[[torch.Tensor], torch.Tensor],
    latent_dim: int,
    sm_scale: float,
) -> torch.Tensor:
    """Sparse MLA in absorbed form: softmax over each query's selected latent rows (SPEC C-NSA).

    Args:
        q: ``[n, heads, W]`` float32 absorbed queries (``[latent | rope]``, W = 576 with DeepSeek sizes).
        topk: ``[n, k]`` int64 selected key positions, ascending, -1 padded (``select_topk``).
        read_rows: maps ``[m]`` int64 key positions (all >= 0) to their ``[m, W]`` float32 latent rows
            (the executor reads them through the rank-major view, the reference from a contiguous tensor).
        latent_dim: the first ``latent_dim`` columns of a row are the values (512).
        sm_scale: softmax scale of ``q . row``.

    Returns:
        ``[n, heads, latent_dim]`` float32: ``sum_s softmax_s(sm_scale * q . row_s) * row_s[:latent_dim]``
        over the selected s. Only selected rows are read, a query chunk at a time
        (``SPARSE_ROWS_BUDGET`` floats of gathered rows at most).
    """
    n, heads, W = q.shape
    out = torch.empty(n, heads, latent_dim, dtype=torch.float32, device=q.device)
    valid_all = topk >= 0
    k_eff = max(int(valid_all.sum(1).max()), 1) if n else 1  # -1 padding sits at the end of each row
    step = max(1, SPARSE_ROWS_BUDGET // (k_eff * W))
    for c0 in range(0, n, step):
        sel, valid = topk[c0 : c0 + step, :k_eff], valid_all[c0 : c0 + step, :k_eff]
        rows = torch.zeros(sel.shape[0], k_eff, W, dtype=torch.float32, device=q.device)
        rows[valid] = read_rows(sel[valid])
        scores = torch.einsum("nhw,nkw->nhk", q[c0 : c0 + step], rows) * sm_scale
        probs = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
        out[c0 : c0 + step] = torch.einsum("nhk,nkd->nhd", probs, rows[..., :latent_dim])
    return out
