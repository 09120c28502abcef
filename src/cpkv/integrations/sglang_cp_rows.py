"""Rows by SGLang's zigzag CP metadata: a rank's shard of hidden states and positions, and the all-gather
rerange back to flat order (SPEC C-GATHER, C-KERNEL; docs/sglang.md, "The model side").

Each function reads only the metadata's block lists (``split_list``, ``zigzag_index``, ``reverse_split_len``,
``cp_reverse_index``, ``max_rank_len``), so it serves ``cpkv.integrations.sglang_cp``'s metadata, whose blocks
sit on the ranks that own their pages, and SGLang's own alike. Index tables are built on the host (O(tokens)
numpy) and applied with one ``index_select`` on the tensor's device. Imports no sglang.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import PlanError

_I64 = np.int64


def local_token_index(meta) -> np.ndarray:
    """Flat indices of the tokens this rank computes, in its local row order, int64 ``[n]``.

    ``meta`` is any zigzag CP metadata (``sglang_cp``'s or SGLang's own): its blocks ``zigzag_index`` of
    ``split_list``. Under a cpkv plan these are the tokens whose ``token_owner`` is the rank, prev blocks
    first (in ascending flat order for one request).
    """
    split = np.asarray(meta.split_list, dtype=_I64)
    start = np.cumsum(split) - split
    blocks = np.asarray(meta.zigzag_index, dtype=_I64)
    return _expand(start[blocks], split[blocks])


def rerange_index(meta) -> np.ndarray:
    """Row of the all-gather buffer that holds each flat token, int64 ``[sum split_list]`` (C-GATHER).

    The buffer is the C ranks' local rows, each padded to ``M = meta.max_rank_len[0]`` rows, in rank
    order; ``gathered[rerange_index(meta)]`` is the batch in flat order. For one request it is the plan's
    ``gather_index``.
    """
    C = len(meta.max_rank_len)
    chunks = np.asarray(meta.reverse_split_len, dtype=_I64).reshape(C, -1)  # [C, 2B] each rank's blocks
    chunk_start = (
        np.cumsum(chunks, axis=1) - chunks + meta.max_rank_len[0] * np.arange(C, dtype=_I64)[:, None]
    )
    order = np.asarray(meta.cp_reverse_index, dtype=_I64)
    return _expand(chunk_start.ravel()[order], np.asarray(meta.split_list, dtype=_I64))


def shard_hidden_states(x: torch.Tensor, meta) -> torch.Tensor:
    """This rank's rows of ``x`` (``[N, ...]``, flat order; rows past ``sum(split_list)`` are padding and
    dropped), in its local order: ``x[local_token_index(meta)]``, same dtype and device. ``[n, ...]``."""
    return x.index_select(0, _on(local_token_index(meta), x.device))


def shard_position_ids(positions: torch.Tensor, meta) -> torch.Tensor:
    """This rank's positions: ``positions`` ``[..., N]`` indexed on its last dimension as ``shard_hidden_states``
    indexes rows (SGLang shards positions, also multi-row ones, on the last dimension)."""
    return positions.index_select(-1, _on(local_token_index(meta), positions.device))


def gather_rerange(gathered: torch.Tensor, meta) -> torch.Tensor:
    """The all-gathered rows (``[C*M, ...]``, rank r's rows padded to ``M = meta.max_rank_len[0]`` at
    ``r*M``) in flat order, ``[sum split_list, ...]``, same dtype and device (C-GATHER, C-KERNEL: each
    block's rank is its owner in the plan, phases included).

    Raises: PlanError when ``gathered`` does not have ``C*M`` rows.
    """
    C, M = len(meta.max_rank_len), meta.max_rank_len[0]
    if gathered.dim() < 1 or gathered.shape[0] != C * M:
        raise PlanError(
            f"gathered must have cp_size * max_rank_len = {C} * {M} = {C * M} rows, "
            f"got shape {list(gathered.shape)}"
        )
    return gathered.index_select(0, _on(rerange_index(meta), gathered.device))


def _expand(start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``[sum length]`` int64: ``start[j], start[j] + 1, ..., start[j] + length[j] - 1`` for each j in turn."""
    offset = np.cumsum(length) - length
    return np.repeat(start - offset, length) + np.arange(int(length.sum()), dtype=_I64)


def _on(index: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(index).to(device)
