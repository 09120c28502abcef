"""SGLang's interleave CP metadata from a cpkv ``interleave`` plan (C-INTERLEAVE, C-GATHER).

SGLang 0.5.23's interleave strategy (``srt/layers/cp/interleave.py``) splits a forward's tokens round robin
over the CP ranks and describes the split with ``InterleaveContextParallelMetadata``. Its default form
(``InterleaveCPStrategy.build_metadata``) gives flat token t to rank ``t % C``; its general form, which
``deepseek_v4_backend._late_layer_tail_cp_layout`` builds for any owner of each row, adds
``per_rank_logical_token`` (rows each rank computes), ``gather_index`` (flat row -> row of the padded
all-gather, ``owner * M + rank of the row among its owner's rows``: C-GATHER) and ``local_index`` (each
rank's rows, then distinct padding rows). SGLang's gathers read ``gather_index`` when it is set
(``_gather_interleaved_tensor``, ``cp_interleave_to_sequence_order``).

``interleave_metadata`` returns that general form for a cpkv plan, so rank r computes exactly the tokens of
the pages it owns (C-OWNER-EQ-COMPUTE) and the all-gather is ``C * max_rank_tokens`` rows. At page_size 1
with phases ``cum_E[i] % C`` a cpkv interleave plan is SGLang's default split itself (flat token t on rank
``t % C``); at page_size P > 1 whole pages go round robin, so a page is never cut between two ranks, and
with ``phase = (b + ceil(L0 / P)) % C`` every page is computed on the rank that SGLang's page-sharded pool
(``PageInterleavePoolAllocator``, rotation base b) stores it on. Imports no sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import INTERLEAVE, check_lane
from ..errors import PlanError
from ..plan import BatchPlan

__all__ = ["InterleaveCPMetadata", "interleave_metadata"]


@dataclass
class InterleaveCPMetadata:
    """SGLang 0.5.23's ``InterleaveContextParallelMetadata`` for one rank, from a cpkv plan.

    Same field names, order and types as SGLang's (``srt/layers/cp/interleave.py``), filled as its general
    (any owner per row) form. Mutable, as SGLang's.

    Attributes:
        total_seq_lens: extend tokens of the batch (N = sum E). bs: requests (B).
        per_rank_actual_token: ``[C]`` ints, each M = ``plan.max_rank_tokens``: every rank's physical rows
            (the all-gather is C * M rows, C-GATHER).
        max_rank_len: ``[C]`` ints, each M.
        per_rank_logical_token: ``[C]`` ints, the tokens each rank computes (``plan.per_rank_tokens``).
        gather_index: int64 ``[N]`` on ``device``: flat token t is row ``gather_index[t]`` of the gathered
            buffer (``plan.gather_index``).
        local_index: int64 ``[M]`` on ``device``: this rank's tokens (flat indices, ascending), then its
            ``M - n_r`` padding rows, numbered from ``N + sum_{q < r} (M - n_q)`` (distinct across ranks).
        moe_local_token_count, graph_num_tokens: None (SGLang's runtime sets them).
    """

    total_seq_lens: int = 0
    bs: int = 1
    per_rank_actual_token: list[int] | None = None
    max_rank_len: list[int] | None = None
    per_rank_logical_token: list[int] | None = None
    gather_index: Any = None
    local_index: Any = None
    moe_local_token_count: Any = None
    graph_num_tokens: int | None = None


def interleave_metadata(
    plan: BatchPlan, rank: int, *, device: torch.device | str = "cpu"
) -> InterleaveCPMetadata:
    """SGLang's interleave CP metadata of ``rank`` for the batch ``plan`` describes (C-INTERLEAVE, C-GATHER).

    Args:
        plan: the forward's ``BatchPlan``, made under ``cp_strategy="interleave"``.
        rank: this rank's index in the CP group, ``0 <= rank < cp_size``.
        device: where the int64 tensors go (SGLang's runtime device).

    Returns:
        An ``InterleaveCPMetadata``; e.g. C=2, P=1, one request L0=0, E=5, rank 1: per_rank_logical_token
        ``[3, 2]``, per_rank_actual_token ``[3, 3]``, gather_index ``[0, 3, 1, 4, 2]``, local_index
        ``[1, 3, 5]`` (5: its padding row).

    Raises:
        PlanError: ``plan`` not a ``BatchPlan``, or made under another CP strategy (zigzag plans have
            ``sglang_cp.zigzag_metadata``). ConfigError: a bad rank.
    """
    if not isinstance(plan, BatchPlan):
        raise PlanError(f"plan must be a BatchPlan, got {type(plan).__name__}")
    if plan.config.cp_strategy != INTERLEAVE:
        raise PlanError(
            f"interleave_metadata needs a plan made under cp_strategy='interleave', got "
            f"{plan.config.cp_strategy!r} (SGLang's zigzag metadata: cpkv.integrations.sglang_cp.zigzag_metadata)"
        )
    C = plan.config.cp_size
    rank = check_lane("rank", rank, C)
    counts = plan.per_rank_tokens.tolist()
    M, N = plan.max_rank_tokens, plan.num_tokens
    mine = np.flatnonzero(plan.token_owner == rank)
    pad_start = N + sum(M - c for c in counts[:rank])
    local = np.concatenate([mine, np.arange(pad_start, pad_start + M - counts[rank], dtype=np.int64)])
    return InterleaveCPMetadata(
        total_seq_lens=N,
        bs=plan.num_requests,
        per_rank_actual_token=[M] * C,
        max_rank_len=[M] * C,
        per_rank_logical_token=counts,
        gather_index=torch.from_numpy(plan.gather_index.copy()).to(device),
        local_index=torch.from_numpy(local).to(device),
    )
