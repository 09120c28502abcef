"""The exact cross-rank merge of partial attention (SPEC C-MERGE) and the global top-k of sharded keys.

Under ``kv_access = local`` a rank holds only its own lane, so a query's attention is assembled from one
partial per rank. Pure functions of tensors, float32, no pages or groups:

- ``shard_softmax``: one rank's softmax weights over the keys it holds, ``exp(s_j - LSE_r)``, and its
  ``LSE_r`` (``-inf`` and zero weights when the rank holds no visible key);
- ``merge_partials``: ``LSE = M + log sum_r exp(LSE_r - M)`` and ``O = sum_r exp(LSE_r - LSE) O_r``, a
  ``-inf`` partial adding exactly zero;
- ``lse_from_base2``: a kernel's base-2 LSE in natural log (C-MERGE merges natural logarithms only);
- ``local_topk``: a rank's ``min(kc, |S_r|)`` largest index logits over its own keys, ties to the lower
  position, as ``(logit, position)`` candidates padded with ``(-inf, -1)``;
- ``merge_topk``: the global top-k of every rank's candidates, the C-NSA rule (the ``min(k, p + 1)``
  largest, ties to the lower position, ascending, -1 padded). It sorts by position before it sorts by
  logit, and positions are unique, so the result does not depend on the order the candidates arrive in:
  every rank gets the same set bit for bit, in every run.
"""

from __future__ import annotations

import math

import torch

from .errors import DistError

_POS_SENTINEL = torch.iinfo(torch.int64).max
"""Sort key of a padding candidate (position -1): after every real position."""


def shard_softmax(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One shard's normalised weights and log-sum-exp over the last dim (SPEC C-MERGE).

    Args:
        scores: ``[..., k]`` float32 ``sm_scale * q . k_j`` of the keys this rank holds, ``-inf`` where the
            query may not see key j (causal mask, key not selected). ``k`` may be 0.

    Returns:
        ``(probs [..., k], lse [...])``: ``probs = exp(s_j - LSE_r)`` and ``LSE_r = m_r + log l_r`` (natural
        log), so ``O_r = probs @ V``. A row with no visible key gets ``LSE_r = -inf`` and all-zero weights
        (never NaN).
    """
    if scores.shape[-1] == 0:
        return scores.clone(), torch.full(
            scores.shape[:-1], float("-inf"), dtype=scores.dtype, device=scores.device
        )
    m = scores.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # an empty row: exp(-inf - 0) = 0 below
    e = torch.exp(scores - m)
    denom = e.sum(-1, keepdim=True)
    lse = (m + torch.log(denom)).squeeze(-1)  # log(0) = -inf for an empty row
    probs = torch.where(denom > 0, e / denom.clamp_min(torch.finfo(scores.dtype).tiny), torch.zeros_like(e))
    return probs, lse


def merge_partials(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge C partial attention outputs exactly (SPEC C-MERGE).

    Args:
        outs: ``[C, ..., d]`` float32 ``O_r`` (zero where a rank saw no key).
        lses: ``[C, ...]`` float32 natural-log ``LSE_r`` (``-inf`` where a rank saw no key).

    Returns:
        ``(O [..., d], LSE [...])``: ``LSE = M + log sum_r exp(LSE_r - M)``, ``M = max_r LSE_r``, and
        ``O = sum_r exp(LSE_r - LSE) O_r``. A partial with ``LSE_r = -inf`` contributes exactly 0, whatever
        its ``O_r`` holds; a query no rank saw gets ``O = 0`` and ``LSE = -inf``.
    """
    M = lses.amax(0)
    M = torch.where(torch.isfinite(M), M, torch.zeros_like(M))
    w = torch.exp(lses - M)  # [C, ...]; exactly 0 for an empty shard
    total = w.sum(0)
    lse = M + torch.log(total)
    coef = w / total.clamp_min(torch.finfo(lses.dtype).tiny)  # exp(LSE_r - LSE)
    contrib = torch.where((w > 0)[..., None], coef[..., None] * outs, torch.zeros_like(outs))
    return contrib.sum(0), lse


def lse_from_base2(lse2: torch.Tensor) -> torch.Tensor:
    """A base-2 log-sum-exp (what some attention kernels return) in natural log: ``lse2 * ln 2``."""
    return lse2 * math.log(2.0)


def local_topk(
    logits: torch.Tensor, key_pos: torch.Tensor, q_pos: torch.Tensor, kc: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's top-k candidates over the keys it holds (SPEC C-MERGE, sparse attention).

    Args:
        logits: ``[n, m]`` float32 index logits of n queries against the rank's m own keys (any values
            for keys after a query: they are masked here).
        key_pos: ``[m]`` int64 positions of the own keys, strictly ascending.
        q_pos: ``[n]`` int64 query positions.
        kc: candidate columns per query (>= 1), at least the query's k where it matters.

    Returns:
        ``(cand_logit [n, kc] float32, cand_pos [n, kc] int64)``: row t holds the ``min(kc, |S_r(t)|)``
        largest logits of the own keys at positions ``<= q_pos[t]`` (ties to the lower position), then
        padding ``(-inf, -1)``.
    """
    n, m = logits.shape
    masked = logits.masked_fill(key_pos[None, :] > q_pos[:, None], float("-inf"))
    kk = min(kc, m)
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices[:, :kk]  # ties: lower position
    seen = torch.searchsorted(key_pos, q_pos, right=True)  # [n] own keys at positions <= q_pos
    valid = torch.arange(kk, device=logits.device)[None, :] < seen[:, None]
    cand_logit = torch.full((n, kc), float("-inf"), dtype=logits.dtype, device=logits.device)
    cand_pos = torch.full((n, kc), -1, dtype=torch.int64, device=logits.device)
    cand_logit[:, :kk] = torch.where(valid, torch.gather(masked, 1, order), cand_logit[:, :kk])
    cand_pos[:, :kk] = torch.where(valid, key_pos[order], cand_pos[:, :kk])
    return cand_logit, cand_pos


def merge_topk(cand_logit: torch.Tensor, cand_pos: torch.Tensor, q_pos: torch.Tensor, k: int) -> torch.Tensor:
    """Global top-k from every rank's candidates (SPEC C-MERGE with the C-NSA rule).

    Args:
        cand_logit: ``[n, M]`` float32 candidate logits of all ranks (any order, ``-inf`` for padding).
        cand_pos: ``[n, M]`` int64 their key positions (unique per row; -1 for padding).
        q_pos: ``[n]`` int64 query positions; row t keeps ``min(k, q_pos[t] + 1)`` keys.
        k: index_topk (>= 1).

    Returns:
        ``[n, k]`` int64: the kept positions ascending, then -1. The same for any order of the candidates.

    Raises:
        DistError: a row has fewer real candidates than it must keep (a rank sent too few).
    """
    n, M = cand_logit.shape
    count = (q_pos + 1).clamp(max=k)
    real = cand_pos >= 0
    if bool((real.sum(1) < count).any()):
        t = int(torch.nonzero(real.sum(1) < count)[0, 0])
        raise DistError(
            f"top-k merge: query at position {int(q_pos[t])} has {int(real[t].sum())} candidates, needs "
            f"{int(count[t])}: every rank must send its min(k, |S_r|) largest"
        )
    key = torch.where(real, cand_pos, torch.full_like(cand_pos, _POS_SENTINEL))
    by_pos = torch.sort(key, dim=1, stable=True)  # unique positions: a total order, whatever the input order
    logit = torch.gather(
        torch.where(real, cand_logit, torch.full_like(cand_logit, float("-inf"))), 1, by_pos.indices
    )
    order = torch.sort(logit, dim=1, descending=True, stable=True).indices  # ties stay in position order
    kk = min(k, M)
    ranked = torch.gather(by_pos.values, 1, order[:, :kk])
    keep = torch.arange(kk, device=cand_pos.device)[None, :] < count[:, None]
    picked = torch.sort(torch.where(keep, ranked, torch.full_like(ranked, _POS_SENTINEL)), dim=1).values
    picked[picked == _POS_SENTINEL] = -1
    out = torch.full((n, k), -1, dtype=torch.int64, device=cand_pos.device)
    out[:, :kk] = picked
    return out
