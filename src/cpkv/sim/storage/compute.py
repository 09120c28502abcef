"""The step's compute plan under a storage design whose pages are not placed by the ranks that compute them
(SPEC C-STORAGE): compute is the group's CP split over the C ranks in every design (C-ZIGZAG, or
C-INTERLEAVE under ``cp_strategy = "interleave"``, SGLang's round-robin split); only where a page is stored
differs.

The scheduler (``sim.admission.StepBuilder``) and the engine read one ``BatchPlan`` per batch: its
``page_owners`` / ``page_indptr`` to size the batch against each lane's room, its token runs for the
MQA-logits budget (C-BUDGET) and the cost model. ``with_storage`` gives them that plan for such a
design: the compute plan, with the new pages replaced by the design's own (its lanes, in its own
unit). Under owner-lane the two are one plan (C-OWNER-EQ-COMPUTE), so nothing is replaced there.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...config import ZIGZAG, CPConfig
from ...plan import BatchPlan
from ...planner import plan_arrays
from ...policy import STATELESS_POLICY, rotation_phase
from ...validate import lengths

_I64 = np.int64


class CPCompute:
    """Compute plans of one group: the ``cp_strategy`` split (C-ZIGZAG or C-INTERLEAVE) over ``cp_size``
    ranks with pages of ``page_size`` tokens.

    A design without owner lanes has no free pages per rank to balance, so each request's phase is the
    C-PHASE rotation rule, ``(prefix_len // P + req_index) % C``; its head tokens (C-HEAD, the rest of a
    partly filled last prefix page) run on that phase's rank, the one that computes the first new page
    (zigzag segment 0, or interleave's page 0).

    Raises:
        ConfigError: bad sizes or an unknown ``cp_strategy`` (``CPConfig``).
    """

    def __init__(self, cp_size: int, page_size: int, cp_strategy: str = ZIGZAG) -> None:
        self.config = CPConfig(cp_size, page_size, STATELESS_POLICY, cp_strategy)

    def plan(self, prefix_lens, extend_lens) -> BatchPlan:
        """The compute ``BatchPlan`` of a batch (``prefix_lens``, ``extend_lens``: ``[B]`` tokens).

        Example C=2, P=1, one request L0=0, E=5: token owners ``[0, 0, 1, 1, 0]`` (the zigzag of C-ZIGZAG);
        ``[0, 1, 0, 1, 0]`` under ``interleave`` (C-INTERLEAVE).

        Raises:
            PlanError: negative or mismatched lengths (as ``plan_batch``).
        """
        L0, E = lengths(prefix_lens, extend_lens)
        cfg = self.config
        heads = rotation_phase(L0, np.arange(L0.shape[0], dtype=_I64), cfg.page_size, cfg.cp_size)
        return plan_arrays(L0, E, cfg, head_owners=heads, phases=None, lanes_valid=True)


def with_storage(compute: BatchPlan, page_owners: np.ndarray, page_indptr: np.ndarray) -> BatchPlan:
    """``compute`` with its new pages replaced by the storage design's: ``page_owners`` (int64 ``[n]``, the
    storage lane of each new page, request order) and ``page_indptr`` (int64 ``[B + 1]``).

    Token runs, per-rank tokens, position runs and ``max_rank_tokens`` stay the compute plan's (what the
    ranks compute, what the budget and the cost model price); ``page_owners`` and ``page_indptr`` say
    where the step's new pages live, as ``alloc_extend``'s plan always does.
    """
    for arr in (page_owners, page_indptr):
        arr.setflags(write=False)
    return replace(compute, page_owners=page_owners, page_indptr=page_indptr)


def new_units(prefix_lens: np.ndarray, extend_lens: np.ndarray, unit_tokens: int) -> np.ndarray:
    """New storage units (pages of ``unit_tokens`` tokens) each request takes: ``ceil((L0 + E) / U) -
    ceil(L0 / U)``, int64 ``[B]``. Example U=8, L0 [0, 6, 8], E [5, 4, 0] -> [1, 1, 0]."""
    U = unit_tokens
    return -(-(prefix_lens + extend_lens) // U) - -(-prefix_lens // U)
