"""One rank's sparse attention for one layer of a CP forward (SPEC C-NSA, C-ESTIMATE).

Rank r computes the tokens it owns (C-OWNER-EQ-COMPUTE). Per request they form maximal runs of positions
``[a, b)`` (``BatchPlan.position_runs``, the very blocks ``mqa_logits_elements`` counts). For each run the
rank

1. reads the index keys ``k_I`` of positions ``0 .. b-1`` from the index-K pool through the rank-major view
   (prefix and other ranks' rows included; the owners wrote them before the write fence);
2. materialises the ``(b - a) x b`` float32 logits block of its ``b - a`` queries and counts its elements;
3. masks keys after each query's position and keeps the top-k positions (ties to the lower position);
4. runs sparse MLA over the selected latent rows only, read through the rank-major view of the latent pool.

The per-layer element count is what the run compares with ``mqa_logits_elements`` (C-ESTIMATE is exact for
this layout, not just an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..planner import BatchPlan
from .errors import DistError
from .indexer import index_logits, mask_causal, select_topk
from .kv_buffer import KVBuffer
from .model import TinyDecoder


@dataclass(frozen=True)
class RankRun:
    """One maximal run of positions one rank computes, and where its queries sit among the rank's tokens.

    Attributes:
        req: batch index of the request. a, b: positions ``[a, b)`` of the run (tokens, prefix included in
            the numbering). lo, hi: rows ``[lo, hi)`` of the run's queries among the rank's own tokens
            (ascending flat order), ``hi - lo == b - a``.
    """

    req: int
    a: int
    b: int
    lo: int
    hi: int


def flat_runs(plan: BatchPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's runs of ``plan.position_runs()`` with their request and first flat token index.

    Returns:
        ``(owner, req, a, b, flat)``, int64 ``[R]`` each: run j covers positions ``[a_j, b_j)`` of request
        ``req_j``, computed by ``owner_j``; its tokens are flat indices ``flat_j .. flat_j + b_j - a_j - 1``
        (the runs tile the batch in flat order).
    """
    owner, a, b = plan.position_runs()
    length = b - a
    flat = np.cumsum(length) - length
    req = np.searchsorted(plan.extend_indptr, flat, side="right") - 1
    return owner, req, a, b, flat


def rank_runs(plan: BatchPlan, rank: int, own: np.ndarray) -> list[RankRun]:
    """The runs of ``rank`` from ``plan.position_runs()``, located among its own tokens.

    Args:
        plan: the forward's ``BatchPlan``.
        rank: this rank.
        own: ``[n_r]`` int64 flat indices of the rank's tokens (``flatnonzero(token_owner == rank)``).

    Returns:
        ``RankRun`` list in flat order; their queries are exactly ``own``, run after run.

    Raises:
        DistError: the plan's runs of ``rank`` do not cover exactly its own tokens (a planner bug).
    """
    owner, req, a, b, flat = flat_runs(plan)
    length = b - a
    mine = np.flatnonzero(owner == rank)
    lo = np.cumsum(length[mine]) - length[mine]
    covered = (
        np.concatenate([np.arange(flat[k], flat[k] + length[k]) for k in mine]) if mine.size else own[:0]
    )
    if not np.array_equal(covered, own):
        raise DistError(
            f"rank {rank}: the plan's position runs cover {covered.shape[0]} tokens that differ from the "
            f"{own.shape[0]} tokens the rank owns (token_owner); C-ESTIMATE blocks would not match the work"
        )
    return [
        RankRun(int(req[k]), int(a[k]), int(b[k]), int(s), int(s + length[k]))
        for k, s in zip(mine.tolist(), lo.tolist(), strict=True)
    ]


def nsa_attention(
    model: TinyDecoder,
    layer: int,
    x: torch.Tensor,
    pos: torch.Tensor,
    runs: list[RankRun],
    kv_slots: tuple[torch.Tensor, ...],
    latent: KVBuffer,
    index_k: KVBuffer,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Indexer, top-k and sparse MLA of this rank's queries in one layer (SPEC C-NSA).

    Args:
        model: the ``TinyDecoder`` (``attention="nsa"``).
        layer: layer index.
        x: ``[n_r, hidden]`` float32 attention input of the rank's tokens; pos: ``[n_r]`` int64 positions.
        runs: ``rank_runs`` of this forward.
        kv_slots: per request ``[L0 + E]`` int64 slots of positions ``0 .. L0+E-1``.
        latent, index_k: the latent (576-wide) and index-K pools; every rank's rows of this layer are
            written (after the write fence).

    Returns:
        ``(attn [n_r, hidden], topk [n_r, index_topk] int64, logits_elements)``: the attention output after
        ``w_o``, each query's selected positions (ascending, -1 padded) and the elements of the logits
        blocks materialised (sum of ``(b - a) * b`` over the runs, counted on the tensors).
    """
    k = model.config.index_topk
    q, w = model.index_queries(layer, x, pos)
    attn = torch.zeros_like(x)
    topk = torch.full((x.shape[0], k), -1, dtype=torch.int64, device=x.device)
    elements = 0
    for run in runs:
        rows = slice(run.lo, run.hi)
        slots = kv_slots[run.req]
        keys = index_k.read(layer, slots[: run.b])  # [b, index_head_dim] through the rank-major view
        logits = index_logits(q[rows], w[rows], keys)  # the (b - a) x b block
        elements += logits.numel()
        sel = select_topk(mask_causal(logits, pos[rows]), pos[rows], k)
        del logits
        topk[rows] = sel
        attn[rows] = model.sparse_attention(
            layer, x[rows], pos[rows], sel, lambda p, slots=slots: latent.read(layer, slots[p])
        )
    return attn, topk, elements
