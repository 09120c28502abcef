"""The owner plans the planner returns: ``RequestPlan`` (one request) and ``BatchPlan`` (a batch, flat),
read-only values with shapes and dtypes fixed (SPEC section 10; C-ZIGZAG, C-HEAD, C-BATCH, C-GATHER).

A ``BatchPlan`` keeps its tokens in run-length form (``runs.TokenRuns``); the per-token arrays
(``token_owner``, ``gather_index``) and the per-request views are built on first access.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .config import CPConfig
from .runs import TokenRuns, offsets_within_key, run_starts

__all__ = ["BatchPlan", "RequestPlan"]


@dataclass(frozen=True, eq=False)
class RequestPlan:
    """Owner plan of one request (SPEC section 10). All arrays are read-only numpy int64.

    Attributes:
        prefix_len: tokens already cached (L0).
        extend_len: new tokens computed in this forward (E).
        req_index: position of the request in its batch.
        phase: lane of zigzag segment 0, or of new page 0 under interleave (C-PHASE, or the explicit ``phase=``).
        head_owner: lane of the partly filled last prefix page when the request has head tokens, else None.
        head_tokens: extend tokens that fill that page, ``h = min(E, P - L0 % P)`` or 0 (C-HEAD).
        page_owners: ``[m]`` owner lane of each new page, in page order (C-ZIGZAG, C-INTERLEAVE).
        token_owner: ``[E]`` rank that computes (and owns) each extend token (C-OWNER-EQ-COMPUTE).
        per_rank_tokens: ``[C]`` extend tokens computed by each rank; sums to E.
        last_token_owner: rank holding the last extend token, -1 when E == 0.
    """

    prefix_len: int
    extend_len: int
    req_index: int
    phase: int
    head_owner: int | None
    head_tokens: int
    page_owners: np.ndarray
    token_owner: np.ndarray
    per_rank_tokens: np.ndarray
    last_token_owner: int

    def __repr__(self) -> str:
        return (
            f"RequestPlan(prefix_len={self.prefix_len}, extend_len={self.extend_len}, req_index={self.req_index}, "
            f"phase={self.phase}, head_owner={self.head_owner}, new_pages={self.num_new_pages}, "
            f"per_rank_tokens={self.per_rank_tokens.tolist()})"
        )

    @property
    def num_new_pages(self) -> int:
        """New pages the request needs (m), in pages."""
        return int(self.page_owners.shape[0])

    def position_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Maximal runs of absolute positions computed by one rank: ``(owner, a, b)``, int64 ``[R]`` each,
        run j covering positions ``[a_j, b_j)`` (prefix included in the numbering), as
        ``BatchPlan.position_runs`` for a batch of this one request. O(E).

        Example C=2, P=1, L0=0, E=5 (owners 0,0,1,1,0): owner [0, 1, 0], a [0, 2, 4], b [2, 4, 5].
        """
        starts = run_starts(self.token_owner)
        ends = np.append(starts[1:], self.token_owner.shape[0])
        return self.token_owner[starts], self.prefix_len + starts, self.prefix_len + ends


@dataclass(frozen=True, eq=False)
class BatchPlan:
    """Owner plan of a batch, planned request by request and flattened in request order (C-BATCH).

    Attributes:
        config: the ``CPConfig`` the plan was made with.
        prefix_lens, extend_lens: ``[B]`` int64, tokens.
        head_owners: ``[B]`` int64 lane that computes each request's head tokens, -1 where it has none.
        request_phases: ``[B]`` int64 phase of each request.
        page_owners: ``[sum m]`` int64 owners of all new pages, request order.
        page_indptr: ``[B + 1]`` int64, request i's pages are ``page_owners[page_indptr[i]:page_indptr[i+1]]``.
        extend_indptr: ``[B + 1]`` int64 cumulative extend lengths (``cum_E``), tokens.
        head_tokens: ``[B]`` int64 head tokens of each request (C-HEAD).
        token_owner: ``[sum E]`` int64 computing rank of every extend token, flat order (built from
            ``token_runs`` on first access, as ``gather_index``: a scheduler that only checks pages and
            budgets never pays for the per-token arrays).
        per_request_rank_tokens: ``[B, C]`` int64 extend tokens per request and rank.
        per_rank_tokens: ``[C]`` int64 extend tokens per rank, summed over the batch.
        last_token_owner: ``[B]`` int64 rank of each request's last token (-1 when E == 0).
        max_rank_tokens: M = max(per_rank_tokens), rows of each rank's all-gather buffer.
        gather_index: ``[sum E]`` int64; ``gathered[gather_index]`` is the flat order (C-GATHER).
        req_indices: ``[B]`` int64 ``req_index`` of each request (0..B-1 for ``plan_batch``).
        token_runs: the same tokens in run-length form (``TokenRuns``), for slot and index expansion.
    """

    config: CPConfig
    prefix_lens: np.ndarray
    extend_lens: np.ndarray
    head_owners: np.ndarray
    request_phases: np.ndarray
    page_owners: np.ndarray
    page_indptr: np.ndarray
    extend_indptr: np.ndarray
    head_tokens: np.ndarray
    per_request_rank_tokens: np.ndarray
    per_rank_tokens: np.ndarray
    last_token_owner: np.ndarray
    max_rank_tokens: int
    req_indices: np.ndarray
    token_runs: TokenRuns = field(repr=False)

    def __repr__(self) -> str:
        return (
            f"BatchPlan(cp_size={self.config.cp_size}, page_size={self.config.page_size}, "
            f"owner_policy={self.config.owner_policy!r}, cp_strategy={self.config.cp_strategy!r}, "
            f"requests={self.num_requests}, tokens={self.num_tokens}, "
            f"new_pages={self.page_owners.shape[0]}, per_rank_tokens={self.per_rank_tokens.tolist()})"
        )

    @property
    def num_requests(self) -> int:
        """B, requests in the batch."""
        return int(self.extend_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        """Total extend tokens of the batch (sum E)."""
        return int(self.extend_indptr[-1])

    @cached_property
    def new_pages_per_lane(self) -> np.ndarray:
        """``[C]`` int64 new pages the batch takes on each lane (``bincount(page_owners)``, at least C entries;
        read-only), what a scheduler checks against each lane's free and evictable pages before it allocates."""
        out = np.bincount(self.page_owners, minlength=self.config.cp_size)
        out.setflags(write=False)
        return out

    @cached_property
    def token_owner(self) -> np.ndarray:
        """``[sum E]`` int64 computing rank of every extend token, flat order (read-only; built on first access)."""
        out = np.repeat(self.token_runs.owner, self.token_runs.length)
        out.setflags(write=False)
        return out

    @cached_property
    def gather_index(self) -> np.ndarray:
        """``[sum E]`` int64; ``gathered[gather_index]`` is the flat order (C-GATHER; read-only, built on first
        access)."""
        out = _gather_index(self.token_runs, self.per_rank_tokens, self.max_rank_tokens)
        out.setflags(write=False)
        return out

    @cached_property
    def requests(self) -> tuple[RequestPlan, ...]:
        """Per-request plans (views into the flat arrays), in batch order."""
        return tuple(self._request(i) for i in range(self.num_requests))

    def position_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Maximal runs of one request's absolute positions computed by one rank: ``(owner, a, b)``.

        Each is int64 ``[R']``, read-only; the run covers positions ``[a, b)`` (prefix included in the
        numbering). Built from ``token_runs`` (O(runs), not O(tokens)) on the first call, merging neighbours of
        one request and owner; later calls return the same arrays (the estimate and the cost model both read them).
        Example C=2, P=1, L0=0, E=5 (owners 0,0,1,1,0): owner [0, 1, 0], a [0, 2, 4], b [2, 4, 5].
        """
        return self._position_runs

    @cached_property
    def _position_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        runs = self.token_runs
        R = runs.length.shape[0]
        flat_start = np.add.accumulate(runs.length) - runs.length
        a = (self.prefix_lens - self.extend_indptr[:-1])[
            runs.req
        ] + flat_start  # [R] first position of each run
        new = np.empty(R + 1, dtype=bool)  # new[j]: run j starts a merged run (empty runs were dropped)
        new[0] = new[R] = True
        np.not_equal(runs.req[1:], runs.req[:-1], out=new[1:R])
        new[1:R] |= runs.owner[1:] != runs.owner[:-1]
        first = new.nonzero()[0]  # [R' + 1]: each merged run's first run, then R
        out = runs.owner[first[:-1]], a[first[:-1]], (a + runs.length)[first[1:] - 1]
        for arr in out:
            arr.setflags(write=False)
        return out

    def _request(self, i: int) -> RequestPlan:
        head = int(self.head_owners[i])
        t0, t1 = self.extend_indptr[i], self.extend_indptr[i + 1]
        return RequestPlan(
            prefix_len=int(self.prefix_lens[i]),
            extend_len=int(self.extend_lens[i]),
            req_index=int(self.req_indices[i]),
            phase=int(self.request_phases[i]),
            head_owner=None if head < 0 else head,
            head_tokens=int(self.head_tokens[i]),
            page_owners=self.page_owners[self.page_indptr[i] : self.page_indptr[i + 1]],
            token_owner=self.token_owner[t0:t1],
            per_rank_tokens=self.per_request_rank_tokens[i],
            last_token_owner=int(self.last_token_owner[i]),
        )


def _gather_index(runs: TokenRuns, per_rank: np.ndarray, M: int) -> np.ndarray:
    """C-GATHER index: ``token_owner[t] * M + (rank of t among its owner's tokens, ascending flat order)``.

    Worked at run granularity: run j with owner r starts at flat token f_j and at local row l_j (tokens of
    earlier runs owned by r), so its tokens map to ``r*M + l_j + (t - f_j)``.
    Example C=2, token_owner [0,0,1,1,0]: M=3, gather_index [0,1,3,4,2].
    """
    return runs.expand(runs.owner * M + offsets_within_key(runs.owner, runs.length, per_rank))
