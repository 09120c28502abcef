"""SGLang's zigzag CP split metadata from a cpkv ``BatchPlan`` (docs/sglang.md, "The model side").

SGLang's CP prefill splits each request's extend into ``2C`` blocks, rank ``r`` computing block ``r`` (prev)
and block ``2C-1-r`` (next), described by ``NSAContextParallelMetadata`` (0.5.9, one request) or
``ZigzagContextParallelMetadata`` (0.5.23, any batch). The builders here return the same fields, names and
dtypes from a cpkv plan, so the ranks compute exactly the tokens whose pages they own
(C-OWNER-EQ-COMPUTE): the blocks are the plan's page-aligned zigzag segments (C-ZIGZAG), each block's rank
its owner (C-PHASE; ``request_phases`` says which), the all-gather buffer ``max(per_rank_actual_token)``
rows a rank (C-GATHER). Under ``legacy`` at P = 1 every field equals SGLang's, byte for byte.

Raises ``UnsupportedPagePlan`` for head tokens (C-HEAD: a third block SGLang's layout cannot hold). The row
shard and rerange (``shard_hidden_states``, ``shard_position_ids``, ``gather_rerange``) live in
``sglang_cp_rows`` and are exported here too. Imports no sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import numpy as np
import torch

from ..config import ZIGZAG, check_lane
from ..errors import PlanError, UnsupportedPagePlan
from ..planner import BatchPlan
from .sglang_cp_rows import (
    gather_rerange,
    local_token_index,
    rerange_index,
    shard_hidden_states,
    shard_position_ids,
)

__all__ = [  # the rows of this metadata too: one namespace for the model runner
    "NSACPMetadata",
    "ZigzagCPMetadata",
    "gather_rerange",
    "local_token_index",
    "nsa_metadata",
    "rerange_index",
    "shard_hidden_states",
    "shard_position_ids",
    "zigzag_metadata",
]

_I64 = np.int64
_INT32_MAX = 2**31 - 1


@dataclass
class ZigzagCPMetadata:
    """SGLang 0.5.23's ``ZigzagContextParallelMetadata`` for one rank, from a cpkv plan, plus ``request_phases``.

    Same field names, order, Python types and dtypes as SGLang's (``build_metadata``): lists of ints on the
    host, int32 tensors on ``device``; B requests, C ranks. Rank r computes, per request i, block ``prev_i``
    (the one of the first C with owner r) and block ``2C-1-prev_i``; its local rows are the prev blocks of all
    requests, then their next blocks. Mutable, as SGLang's (its ``pad_logical_token_to_physical`` sets
    ``per_rank_logical_token``, ``per_rank_actual_token`` and ``max_rank_len``). Every field's shape and
    meaning: the table in docs/sglang.md, "The model side". The main ones:

    Attributes:
        split_list: ``[B*2C]`` tokens of each block, request-major. zigzag_index: ``[2B]`` this rank's blocks.
        per_rank_actual_token: ``[C]`` tokens each rank computes (the plan's ``per_rank_tokens``).
        max_rank_len: ``[C]``, each ``max(per_rank_actual_token)``: rows of every rank's all-gather buffer.
        kv_len_*_tensor, actual_seq_q_*_tensor: int32 ``[B]`` (``*_combined``: ``[2B]``, prev then next);
            ``cu_seqlens_*``: their running sums from 0.
        request_phases: ``[B]`` each request's phase in the plan (cpkv's addition; 0 under ``legacy``).
    """

    total_seq_lens: int = 0
    bs: int = 1
    split_list: list[int] | None = None
    zigzag_index: list[int] | None = None
    cp_reverse_index: list[int] | None = None
    reverse_split_len: list[int] | None = None
    per_rank_actual_token: list[int] | None = None
    max_rank_len: list[int] | None = None
    per_rank_logical_token: list[int] | None = None
    kv_len_prev_tensor: Any = None
    kv_len_next_tensor: Any = None
    cu_seqlens_kv_prev_tensor: Any = None
    cu_seqlens_kv_next_tensor: Any = None
    actual_seq_q_prev_tensor: Any = None
    actual_seq_q_next_tensor: Any = None
    cu_seqlens_q_prev_tensor: Any = None
    cu_seqlens_q_next_tensor: Any = None
    actual_seq_q_combined_tensor: Any = None
    kv_len_combined_tensor: Any = None
    cu_seqlens_q_combined_tensor: Any = None
    cu_seqlens_kv_combined_tensor: Any = None
    total_q_prev_tokens: int = 0
    total_q_next_tokens: int = 0
    max_seqlen_q_prev: int = 0
    max_seqlen_q_next: int = 0
    max_seqlen_q_combined: int = 0
    kv_len_prev_list: list[int] | None = None
    kv_len_next_list: list[int] | None = None
    actual_seq_q_prev_list: list[int] | None = None
    actual_seq_q_next_list: list[int] | None = None
    request_phases: list[int] | None = None


@dataclass
class NSACPMetadata:
    """SGLang 0.5.9's ``NSAContextParallelMetadata`` (one request) for one rank, plus ``request_phases``.

    Same fields, order and types as ``prepare_input_dp_with_cp_dsa`` returns. With C ranks: ``split_list``
    ``[2C]``, ``max_rank_len`` ``[C]`` (each ``max(per_rank_actual_token)``; SGLang's ``ceil(E / C)`` is
    the same only for its token split), ``zigzag_index`` ``[2]`` (prev block, next block),
    ``per_rank_actual_token`` ``[C]``, ``reverse_split_len`` ``[2C]``, ``cp_reverse_index`` ``[2C]`` (as in
    ``ZigzagCPMetadata`` with B = 1); ``kv_len_prev`` / ``kv_len_next``: ints, extend tokens up to the end
    of the prev / next block (SGLang 0.5.9 counts them within the extend and adds the prefix where it reads
    them); ``actual_seq_q_prev`` / ``actual_seq_q_next``: tokens of the two blocks; the four ``*_tensor``
    fields the same four values as 0-d int32 tensors on ``device``; ``total_seq_lens`` the extend length
    as a 0-d int64 CPU tensor; ``request_phases`` ``[1]`` (cpkv's addition).
    """

    split_list: list[int] | None = None
    max_rank_len: list[int] | None = None
    zigzag_index: list[int] | None = None
    per_rank_actual_token: list[int] | None = None
    reverse_split_len: list[int] | None = None
    cp_reverse_index: list[int] | None = None
    kv_len_prev: int = -1
    kv_len_next: int = -1
    actual_seq_q_prev: int = -1
    actual_seq_q_next: int = -1
    kv_len_prev_tensor: Any = None
    kv_len_next_tensor: Any = None
    actual_seq_q_prev_tensor: Any = None
    actual_seq_q_next_tensor: Any = None
    total_seq_lens: Any = None
    request_phases: list[int] | None = None


@dataclass(frozen=True)
class _RankView:
    """One rank's share of the blocks, numpy int64: ``prev`` / ``next`` ``[B]`` block of each request,
    ``q_prev`` / ``q_next`` ``[B]`` their tokens, ``end_prev`` / ``end_next`` ``[B]`` extend tokens up to
    their ends; ``split`` ``[B, 2C]``, ``cp_reverse_index`` ``[B*2C]``, ``reverse_split_len`` ``[C*2B]``,
    ``per_rank`` ``[C]``, ``prefix_lens`` and ``phases`` ``[B]``."""

    split: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    q_prev: np.ndarray
    q_next: np.ndarray
    end_prev: np.ndarray
    end_next: np.ndarray
    cp_reverse_index: np.ndarray
    reverse_split_len: np.ndarray
    per_rank: np.ndarray
    prefix_lens: np.ndarray
    phases: np.ndarray


def zigzag_metadata(plan: BatchPlan, rank: int, *, device: torch.device | str = "cpu") -> ZigzagCPMetadata:
    """SGLang 0.5.23's zigzag CP metadata of ``rank`` for the batch ``plan`` describes (C-ZIGZAG, C-PHASE).

    Args:
        plan: the forward's ``BatchPlan`` (e.g. ``OwnerLaneTokenToKVPoolAllocator.last_plan``).
        rank: this rank's index in the CP group, ``0 <= rank < cp_size``.
        device: where the int32 tensors go (SGLang's runtime device).

    Returns:
        A ``ZigzagCPMetadata``; e.g. C=2, P=1, one request L0=0, E=5 under ``legacy``, rank 0:
        ``split_list [2, 1, 1, 1]``, ``zigzag_index [0, 3]``, ``per_rank_actual_token [3, 2]``.

    Raises:
        UnsupportedPagePlan: a request with head tokens (C-HEAD), owners SGLang's layout cannot express, or
            an ``interleave`` plan (C-INTERLEAVE: ``sglang_cp_interleave.interleave_metadata``).
        PlanError: ``plan`` not a ``BatchPlan``, a length above SGLang's int32 range; ConfigError: a bad rank.
    """
    v = _rank_view(plan, rank)
    B = v.split.shape[0]
    kv_prev, kv_next = (v.prefix_lens + v.end_prev).tolist(), (v.prefix_lens + v.end_next).tolist()
    q_prev, q_next = v.q_prev.tolist(), v.q_next.tolist()
    S = v.split.shape[1]
    base = np.arange(B, dtype=_I64) * S
    per_rank = v.per_rank.tolist()
    cu = {
        name: [0, *accumulate(values)]
        for name, values in (
            ("q_prev", q_prev),
            ("q_next", q_next),
            ("kv_prev", kv_prev),
            ("kv_next", kv_next),
            ("q_comb", q_prev + q_next),
            ("kv_comb", kv_prev + kv_next),
        )
    }
    t = _Int32Tensors(device)
    return ZigzagCPMetadata(
        total_seq_lens=int(v.split.sum()),
        bs=B,
        split_list=v.split.ravel().tolist(),
        zigzag_index=(base + v.prev).tolist() + (base + v.next).tolist(),
        cp_reverse_index=v.cp_reverse_index.tolist(),
        reverse_split_len=v.reverse_split_len.tolist(),
        per_rank_actual_token=per_rank,
        max_rank_len=[max(per_rank)] * len(per_rank),
        kv_len_prev_tensor=t("kv_len_prev", kv_prev),
        kv_len_next_tensor=t("kv_len_next", kv_next),
        cu_seqlens_kv_prev_tensor=t("cu_seqlens_kv_prev", cu["kv_prev"]),
        cu_seqlens_kv_next_tensor=t("cu_seqlens_kv_next", cu["kv_next"]),
        actual_seq_q_prev_tensor=t("actual_seq_q_prev", q_prev),
        actual_seq_q_next_tensor=t("actual_seq_q_next", q_next),
        cu_seqlens_q_prev_tensor=t("cu_seqlens_q_prev", cu["q_prev"]),
        cu_seqlens_q_next_tensor=t("cu_seqlens_q_next", cu["q_next"]),
        actual_seq_q_combined_tensor=t("actual_seq_q_combined", q_prev + q_next),
        kv_len_combined_tensor=t("kv_len_combined", kv_prev + kv_next),
        cu_seqlens_q_combined_tensor=t("cu_seqlens_q_combined", cu["q_comb"]),
        cu_seqlens_kv_combined_tensor=t("cu_seqlens_kv_combined", cu["kv_comb"]),
        total_q_prev_tokens=cu["q_prev"][-1],
        total_q_next_tokens=cu["q_next"][-1],
        max_seqlen_q_prev=max(q_prev, default=0),
        max_seqlen_q_next=max(q_next, default=0),
        max_seqlen_q_combined=max(q_prev + q_next, default=0),
        kv_len_prev_list=kv_prev,
        kv_len_next_list=kv_next,
        actual_seq_q_prev_list=q_prev,
        actual_seq_q_next_list=q_next,
        request_phases=v.phases.tolist(),
    )


def nsa_metadata(plan: BatchPlan, rank: int, *, device: torch.device | str = "cpu") -> NSACPMetadata:
    """SGLang 0.5.9's ``NSAContextParallelMetadata`` of ``rank`` for a plan of one request (C-ZIGZAG, C-GATHER).

    Args and raises as ``zigzag_metadata``; also PlanError when the plan holds other than one request
    (SGLang 0.5.9's in-seq-split CP is for bs = 1; ``zigzag_metadata`` takes any batch).

    Example C=2, P=1, L0=0, E=5, ``legacy``, rank 1: ``split_list [2, 1, 1, 1]``, ``zigzag_index [1, 2]``,
    ``kv_len_prev 3``, ``kv_len_next 4``, ``actual_seq_q_prev 1``, ``actual_seq_q_next 1``.
    """
    if isinstance(plan, BatchPlan) and plan.num_requests != 1:
        raise PlanError(
            f"SGLang 0.5.9's NSA CP metadata is for one request, the plan has {plan.num_requests}; "
            "use zigzag_metadata for a batch"
        )
    v = _rank_view(plan, rank)
    per_rank = v.per_rank.tolist()
    prev, nxt = int(v.prev[0]), int(v.next[0])
    scalars = dict(
        kv_len_prev=int(v.end_prev[0]),
        kv_len_next=int(v.end_next[0]),
        actual_seq_q_prev=int(v.q_prev[0]),
        actual_seq_q_next=int(v.q_next[0]),
    )
    t = _Int32Tensors(device)
    fields: dict[str, Any] = {
        **scalars,
        **{f"{name}_tensor": t(name, value) for name, value in scalars.items()},
    }
    return NSACPMetadata(
        split_list=v.split[0].tolist(),
        max_rank_len=[max(per_rank)] * len(per_rank),
        zigzag_index=[prev, nxt],
        per_rank_actual_token=per_rank,
        reverse_split_len=v.reverse_split_len.tolist(),
        cp_reverse_index=v.cp_reverse_index.tolist(),
        **fields,
        total_seq_lens=torch.tensor(int(v.split.sum())),
        request_phases=v.phases.tolist(),
    )


# ------------------------------------------------------------------------------------------- internals
def _rank_view(plan: BatchPlan, rank: int) -> _RankView:
    """The plan's zigzag blocks and ``rank``'s share of them (see ``_RankView``); raises as ``zigzag_metadata``."""
    if not isinstance(plan, BatchPlan):
        raise PlanError(f"plan must be a BatchPlan, got {type(plan).__name__}")
    if plan.config.cp_strategy != ZIGZAG:  # its pages go round robin, not in 2C zigzag blocks
        raise UnsupportedPagePlan(
            f"the plan's cp_strategy is {plan.config.cp_strategy!r}: zigzag_metadata and "
            "nsa_metadata describe zigzag plans (C-ZIGZAG); an interleave plan's metadata is "
            "sglang_cp_interleave.interleave_metadata (C-INTERLEAVE)"
        )
    C = plan.config.cp_size
    rank = check_lane("rank", rank, C)
    split, owner = _blocks(plan)
    B, S = split.shape
    rows = np.arange(B, dtype=_I64)
    prev_of = np.argsort(owner[:, :C], axis=1, kind="stable")  # [B, C]: the prev block of each rank
    next_of = S - 1 - prev_of
    prev_tokens, next_tokens = split[rows[:, None], prev_of], split[rows[:, None], next_of]  # [B, C]
    ends = np.cumsum(split, axis=1)
    half = np.where(np.arange(S) < C, 0, B)  # [S]: a block's chunk is its rank's i-th prev or (B+i)-th next
    prev, nxt = prev_of[:, rank], next_of[:, rank]
    return _RankView(
        split=split,
        prev=prev,
        next=nxt,
        q_prev=split[rows, prev],
        q_next=split[rows, nxt],
        end_prev=ends[rows, prev],
        end_next=ends[rows, nxt],
        cp_reverse_index=(owner * 2 * B + half[None, :] + rows[:, None]).ravel(),
        reverse_split_len=np.concatenate([prev_tokens.T, next_tokens.T], axis=1).ravel(),
        per_rank=prev_tokens.sum(axis=0) + next_tokens.sum(axis=0),
        prefix_lens=plan.prefix_lens,
        phases=plan.request_phases,
    )


def _blocks(plan: BatchPlan) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, owner)``, int64 ``[B, 2C]``: each request's 2C zigzag segments as SGLang blocks.

    A block that holds tokens takes its rank from the plan (``token_runs``: one run per non-empty
    segment, and C-ZIGZAG fills segments in order, so a request's runs are its segments 0, 1, ...); an
    empty block (fewer than 2C new pages) goes where the request's phase puts it, ``(z(s) + phase) % C``,
    so every list keeps SGLang's shape. Then every rank must hold one block of each half, block
    ``2C-1-s`` on the rank of block s, or SGLang's layout cannot express the plan (UnsupportedPagePlan).
    """
    C, P = plan.config.cp_size, plan.config.page_size
    B, S = plan.num_requests, 2 * plan.config.cp_size
    head = np.flatnonzero(plan.head_tokens > 0)
    if head.size:
        i = int(head[0])
        raise UnsupportedPagePlan(
            f"request {i}: prefix_len={int(plan.prefix_lens[i])} ends inside a page (page_size={P}), so its first "
            f"{int(plan.head_tokens[i])} tokens are computed by the page's owner, rank {int(plan.head_owners[i])}: "
            "a third block SGLang's two-block zigzag layout has no place for; keep chunk boundaries page-aligned"
        )
    big = np.flatnonzero(plan.prefix_lens + plan.extend_lens > _INT32_MAX)
    if big.size:
        i = int(big[0])
        raise PlanError(
            f"request {i}: prefix_len + extend_len = {int(plan.prefix_lens[i] + plan.extend_lens[i])} "
            f"is above SGLang's int32 lengths ({_INT32_MAX})"
        )
    runs = plan.token_runs
    seg = np.arange(runs.req.shape[0], dtype=_I64) - np.searchsorted(runs.req, runs.req)  # [R] run's segment
    s = np.arange(S, dtype=_I64)
    owner = (np.where(s < C, s, S - 1 - s)[None, :] + plan.request_phases[:, None]) % C
    owner[runs.req, seg] = runs.owner
    tokens = np.zeros((B, S), dtype=_I64)
    tokens[runs.req, seg] = runs.length
    first = owner[:, :C]
    ok = (np.sort(first, axis=1) == s[None, :C]).all(axis=1) & (owner[:, C:] == first[:, ::-1]).all(axis=1)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise UnsupportedPagePlan(
            f"request {i}: block owners {owner[i].tolist()} do not give every rank one block "
            "of each half, mirrored (block 2C-1-s on the rank of block s)"
        )
    return tokens, owner


class _Int32Tensors:
    """``t(name, values)``: an int32 tensor on ``device`` (SGLang's attention-metadata dtype), or PlanError
    naming ``name`` when a value is above the int32 range."""

    def __init__(self, device) -> None:
        self.device = device

    def __call__(self, name: str, values) -> torch.Tensor:
        top = int(np.max(values, initial=0))
        if top > _INT32_MAX:
            raise PlanError(f"{name} holds {top}, above SGLang's int32 metadata range")
        return torch.tensor(values, dtype=torch.int32, device=self.device)
