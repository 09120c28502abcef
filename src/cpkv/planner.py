"""Owner planning: rotation phase, zigzag or interleaved page owners, head tokens, batches, gather index.

Implements SPEC C-PHASE, C-ZIGZAG, C-INTERLEAVE, C-HEAD, C-OWNER-EQ-COMPUTE, C-BATCH, C-BS1-COMPATIBILITY and
C-GATHER.

One code path: ``plan_request`` is ``plan_batch`` of one request. The batch planner is vectorised over
requests, pages and tokens at once (numpy; no Python loop over tokens or pages), and every request is
planned on its own, with its own phase, before the results are flattened in request order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from .config import INTERLEAVE, LEGACY, CPConfig
from .errors import PlanError, UnsupportedPagePlan
from .interleave import interleave_split
from .plan import BatchPlan, RequestPlan
from .policy import rotation_phase, zigzag_lane_pages
from .runs import RAMP, TokenRuns, indptr
from .validate import (
    MAX_POSITION,
    check_int,
    check_len,
    check_plan_size,
    check_scalar,
    first_bad,
    lengths,
    optional_lanes,
    plan_bytes,
)

__all__ = [  # the plan types (plan.py), MAX_POSITION, plan_bytes (validate.py), zigzag_lane_pages (policy.py) too
    "MAX_POSITION",
    "BatchPlan",
    "RequestPlan",
    "owner_lane_phase",
    "plan_arrays",
    "plan_batch",
    "plan_bytes",
    "plan_request",
    "zigzag_lane_pages",
]

_I64 = np.int64


def owner_lane_phase(prefix_len: int, page_size: int, req_index: int, cp_size: int) -> int:
    """Rotation phase of one request: ``((prefix_len // page_size) + req_index) % cp_size`` (SPEC C-PHASE).

    Args:
        prefix_len: tokens already cached (int >= 0).
        page_size: tokens per page (int >= 1).
        req_index: position of the request in its batch (int >= 0).
        cp_size: ranks in the CP group (int >= 1).

    Returns:
        The lane (int in ``[0, cp_size)``) that owns zigzag segment 0 of the request's new pages.

    Raises:
        PlanError: a negative length or index, or one above ``MAX_POSITION``; ConfigError: ``page_size < 1``,
            ``cp_size < 1`` or above ``cpkv.limits.MAX_CP_SIZE``.
    """
    page_size = check_int("page_size", page_size, 1)
    cp_size = check_int("cp_size", cp_size, 1)
    prefix_len = check_len("prefix_len", prefix_len)
    req_index = check_len("req_index", req_index)
    return rotation_phase(prefix_len, req_index, page_size, cp_size)


def plan_request(
    prefix_len: int,
    extend_len: int,
    config: CPConfig,
    *,
    req_index: int = 0,
    head_owner: int | None = None,
    phase: int | None = None,
) -> RequestPlan:
    """Plan the owners of one request's extend tokens (SPEC C-PHASE, C-ZIGZAG or C-INTERLEAVE, C-HEAD).

    The same code path as ``plan_batch`` (C-BS1-COMPATIBILITY): this is the batch planner on a batch of
    one whose request sits at ``req_index``.

    Args:
        prefix_len: tokens already in the KV cache (L0 >= 0).
        extend_len: new tokens (E >= 0).
        config: the CP group's ``CPConfig`` (cp_size, page_size, owner_policy, cp_strategy).
        req_index: position of the request in its batch, ``0 <= req_index <= MAX_POSITION``; enters the
            rotation phase.
        head_owner: lane of the page holding ``last_loc`` (needed when ``L0 % P != 0`` and ``E > 0``).
        phase: explicit phase in ``[0, C)`` (used by the ``balanced`` allocator); overrides the policy.

    Returns:
        A ``RequestPlan``; e.g. C=4, P=64, L0=0, E=1000: page_owners ``[0,0,1,1,2,2,3,3,3,3,2,2,1,1,0,0]``
        under ``zigzag``, ``[0,1,2,3] * 4`` under ``interleave`` (per_rank_tokens ``[256,256,256,232]``).

    Raises:
        PlanError: a non-integer argument (a bool, a float; the message names ``prefix_len``, ``extend_len``,
            ``head_owner`` or ``phase``), negative lengths or index, ``req_index`` above ``MAX_POSITION``,
            phase or head owner out of range
            (message names the value).
        UnsupportedPagePlan: head tokens to compute but no head owner.
    """
    req_index = check_len("req_index", req_index)
    check_scalar("prefix_len", prefix_len)
    check_scalar("extend_len", extend_len)
    check_scalar("head_owner", head_owner, optional=True)
    check_scalar("phase", phase, optional=True)
    phases = None if phase is None else [phase]
    plan = _plan(
        [prefix_len], [extend_len], config, head_owners=[head_owner], phases=phases, first_index=req_index
    )
    return plan.requests[0]


def plan_batch(
    prefix_lens: Sequence[int] | np.ndarray,
    extend_lens: Sequence[int] | np.ndarray,
    config: CPConfig,
    *,
    head_owners: Sequence[int | None] | np.ndarray | None = None,
    phases: Sequence[int] | np.ndarray | None = None,
) -> BatchPlan:
    """Plan a batch request by request (``req_index`` = batch position) and flatten (SPEC C-BATCH).

    Args:
        prefix_lens: ``[B]`` tokens already cached per request (ints >= 0; list, numpy or CPU tensor).
        extend_lens: ``[B]`` new tokens per request (ints >= 0; a request with E == 0 contributes nothing).
        config: the CP group's ``CPConfig``.
        head_owners: ``[B]`` lane of each request's ``last_loc`` page; None or -1 for "none".
        phases: ``[B]`` explicit phases in ``[0, C)``; None applies ``config.owner_policy``
            (``balanced`` without phases falls back to the rotation rule, C-BALANCED).

    Returns:
        A ``BatchPlan`` with flat ``token_owner``, ``gather_index`` and per-request plans.

    Raises:
        PlanError: mismatched lengths, negative lengths, out-of-range head owner or phase; the message
            names the request index and the value. Also non-integer entries (a bool, a float), a tensor
            without data (``meta`` device) or of a dtype numpy cannot hold, naming the argument.
        UnsupportedPagePlan: a request with head tokens and no head owner (C-HEAD).
    """
    return _plan(prefix_lens, extend_lens, config, head_owners=head_owners, phases=phases, first_index=0)


def _plan(
    prefix_lens: object,
    extend_lens: object,
    config: object,
    *,
    head_owners: object,
    phases: object,
    first_index: int,
) -> BatchPlan:
    """The single planner behind ``plan_request`` and ``plan_batch`` (C-BS1-COMPATIBILITY)."""
    if not isinstance(config, CPConfig):
        raise PlanError(f"config must be a CPConfig, got {type(config).__name__}")
    L0, E = lengths(prefix_lens, extend_lens, first_index)
    return plan_arrays(L0, E, config, head_owners=head_owners, phases=phases, first_index=first_index)


def plan_arrays(
    L0: np.ndarray,
    E: np.ndarray,
    config: CPConfig,
    *,
    head_owners: object,
    phases: object,
    first_index: int = 0,
    lanes_valid: bool = False,
) -> BatchPlan:
    """``plan_batch`` for a caller that has already checked the lengths (C-BATCH, C-HEAD, C-ZIGZAG,
    C-INTERLEAVE: ``config.cp_strategy`` picks the page rule).

    Args:
        L0, E: ``[B]`` int64 prefix and extend lengths as ``validate.lengths`` returns them (valid; copied,
            never modified).
        config: the ``CPConfig``.
        head_owners, phases: as for ``plan_batch``; with ``lanes_valid`` they must already be int64 ``[B]``
            arrays in ``[-1, C)`` and ``[0, C)`` (phases may be None), as the allocator derives them, and
            are not checked again.
        first_index: ``req_index`` of request 0 (``plan_request``'s).

    Returns:
        The ``BatchPlan``.

    Raises:
        PlanError: a plan above ``cpkv.limits.MAX_ARRAY_BYTES``; unchecked head owners or phases out of
            range. UnsupportedPagePlan: head tokens without a head owner.
    """
    C, P = config.cp_size, config.page_size
    check_plan_size(L0, E, config)
    L0, E = L0.copy(), E.copy()  # the plan's own arrays, never the caller's (they are made read-only below)
    B = L0.shape[0]
    head = cast(np.ndarray, head_owners) if lanes_valid else optional_lanes("head_owners", head_owners, B, C)
    req_idx = np.arange(first_index, first_index + B, dtype=_I64)

    # C-HEAD: h = min(E, P - L0 % P) head tokens fill the partly filled last prefix page (0 when L0 % P == 0).
    h = np.minimum(E, -L0 % P)
    i = first_bad((h > 0) & (head < 0))
    if i is not None:
        raise UnsupportedPagePlan(
            f"request {i + first_index}: prefix_len={int(L0[i])} is not a multiple of page_size={P} and "
            f"extend_len={int(E[i])} > 0, so head_owner (the lane of the page holding last_loc) is required"
        )

    # C-PHASE: explicit phases win; else rotation (balanced without phases uses rotation) or legacy 0.
    if phases is not None and lanes_valid:
        phase = cast(np.ndarray, phases)
    elif phases is not None:
        phase = optional_lanes("phases", phases, B, C)
        i = first_bad(phase < 0)
        if i is not None:
            raise PlanError(f"request {i + first_index}: phase={int(phase[i])} out of range [0, {C})")
    elif config.owner_policy == LEGACY:
        phase = np.zeros(B, dtype=_I64)
    else:
        phase = rotation_phase(L0, req_idx, P, C)

    head = np.where(h > 0, head, -1)  # a head owner is recorded only where head tokens exist (C-HEAD)
    if config.cp_strategy == INTERLEAVE:  # C-INTERLEAVE: counts in closed form, the runs deferred
        m, page_owners, per_req, last_owner, runs = interleave_split(E, h, head, phase, C, P)
    else:
        m, page_owners, runs, last_owner = _runs(E, h, head, phase, C, P)
        per_req = np.bincount(runs.req * C + runs.owner, weights=runs.length, minlength=B * C)
        per_req = per_req.astype(_I64).reshape(B, C)
    per_rank = np.add.reduce(per_req, axis=0)
    max_rank = max(per_rank.tolist(), default=0)
    page_indptr = indptr(m)
    arrays = dict(
        prefix_lens=L0,
        extend_lens=E,
        head_owners=head,
        request_phases=phase,
        page_owners=page_owners,
        page_indptr=page_indptr,
        extend_indptr=indptr(E),
        head_tokens=h,
        per_request_rank_tokens=per_req,
        per_rank_tokens=per_rank,
        last_token_owner=last_owner,
        req_indices=req_idx,
    )
    for arr in arrays.values():
        arr.setflags(write=False)
    return BatchPlan(config=config, max_rank_tokens=max_rank, token_runs=runs, **arrays)


def _runs(
    E: np.ndarray, h: np.ndarray, head: np.ndarray, phase: np.ndarray, C: int, P: int
) -> tuple[np.ndarray, np.ndarray, TokenRuns, np.ndarray]:
    """C-HEAD and C-ZIGZAG at run granularity: ``(m, page_owners, runs, last_token_owner)``: new pages int64
    ``[B]``, the owner of every new page int64 ``[sum m]``, the ``TokenRuns`` and each request's last token's
    owner int64 ``[B]`` (-1 when E == 0). ``E``, ``h`` (head tokens), ``head`` (recorded head owner, -1
    where h == 0) and ``phase`` are int64 ``[B]``. Derivation: docs/placement.md. Example C=4, m=16, phase
    0: page owners [0,0,1,1,2,2,3,3,3,3,2,2,1,1,0,0].
    """
    B, S = E.shape[0], 2 * C
    t = E - h  # [B] tokens on new pages
    m = -(-t // P)  # [B] new pages
    base, rem = np.divmod(m, S)
    pages, owner = _segment_rows(rem, phase, C)  # [B, S + 1] each, new arrays: pages per run [0, (s < m % 2C)
    pages += base[
        :, None
    ]  # for each segment s] plus m // 2C; owners [-, (z_s + phase) % C for each segment s]
    pages[:, 0] = 0  # ... and no page for the head run
    owner[:, 0] = head
    length = pages * P
    length[:, 0] = h
    last = np.minimum(m, S)  # [B] column of each request's last run, as a flat index:
    last += RAMP[: B * (S + 1) : S + 1] if B * (S + 1) <= RAMP.shape[0] else np.arange(0, B * (S + 1), S + 1)
    flat_len = length.ravel()
    flat_len[last] -= -t % P
    keep = (flat_len > 0).nonzero()[0]  # flat (request, run) index of every non-empty run
    flat_owner = owner.ravel()
    runs = TokenRuns(
        req=keep // (S + 1),
        owner=flat_owner.take(keep),
        length=flat_len.take(keep),
        pages=pages.ravel().take(keep),
    )
    return m, np.repeat(flat_owner, pages.ravel()), runs, flat_owner.take(last)


_SEGMENT_TABLES: dict[int, tuple[np.ndarray, np.ndarray]] = {}
_TABLE_MAX_CP = 64  # segment tables are cached up to this cp_size (24 C (2C + 1) bytes: 195 KiB at 64)


def _segment_rows(rem: np.ndarray, phase: np.ndarray, C: int) -> tuple[np.ndarray, np.ndarray]:
    """``(fill, lanes)`` rows of a batch, int64 ``[B, 2C+1]`` each (new arrays): ``_segment_tables``'s row
    ``rem[i]`` of ``fill`` and row ``phase[i]`` of ``lanes`` for request i. Up to ``_TABLE_MAX_CP`` lanes the
    rows are taken from the cached tables; above it they are computed, O(B * C), so a large cp_size never
    builds the O(C**2) tables (at 4096 lanes they would take 768 MiB)."""
    if C <= _TABLE_MAX_CP:
        fill, lanes = _segment_tables(C)
        return fill[rem], lanes[phase]
    S = 2 * C
    s = np.arange(S, dtype=_I64)
    z = np.where(s < C, s, S - 1 - s)
    fill = np.zeros((rem.shape[0], S + 1), dtype=_I64)
    np.less(s[None, :], rem[:, None], out=fill[:, 1:], casting="unsafe")
    lanes = np.zeros((phase.shape[0], S + 1), dtype=_I64)
    np.remainder(z[None, :] + phase[:, None], C, out=lanes[:, 1:])
    return fill, lanes


def _segment_tables(C: int) -> tuple[np.ndarray, np.ndarray]:
    """``(fill, lanes)``, int64 ``[2C, 2C+1]`` and ``[C, 2C+1]``, read-only, made once per cp_size (only up to
    ``_TABLE_MAX_CP``, see ``_segment_rows``): per run column (0: the head run, 1 + s: segment s)
    ``fill[r, 1 + s] = [s < r]`` and ``lanes[f, 1 + s] = (z + f) % C`` with zigzag rank
    ``z = s if s < C else 2C-1-s``; column 0 is 0."""
    got = _SEGMENT_TABLES.get(C)
    if got is None:
        s = np.arange(2 * C, dtype=_I64)
        z = np.where(s < C, s, 2 * C - 1 - s)
        fill = np.zeros((2 * C, 2 * C + 1), dtype=_I64)
        fill[:, 1:] = s[None, :] < s[:, None]
        lanes = np.zeros((C, 2 * C + 1), dtype=_I64)
        lanes[:, 1:] = (z[None, :] + s[:C, None]) % C
        got = _SEGMENT_TABLES[C] = (fill, lanes)
        for arr in got:
            arr.setflags(write=False)
    return got
