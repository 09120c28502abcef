"""Plans ``plan_extend`` made, kept for the ``alloc_extend`` that follows with the same arguments.

A scheduler checks a batch on ``OwnerLaneAllocator.plan_extend`` (pages per lane, the MQA-logits budget)
and then allocates it with ``alloc_extend`` and the same arguments; often it evicts in between. The plan
is a function of the arguments alone under ``rotation`` and ``legacy`` (phases by position), and of the
arguments and the free pages per lane under ``balanced`` (C-BALANCED); only the check of ``last_locs``
(C-FAIL-FAST: the page holding it must be handed out) reads the rest of the allocator's state. So a plan
made earlier is the plan a new call would make while its phases' inputs are the same, once ``last_locs``
pass the check again: the allocator plans once per batch instead of once per call. Under ``balanced``
a kept plan whose phases the new free pages choose again is that plan too (the planner is a function
of the lengths, head owners and phases), so an eviction that moves no phase costs no new plan.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from ..plan import BatchPlan


class MemoHit(NamedTuple):
    """A kept plan: ``plan``, and ``current`` (False: pages changed since, so re-check ``last_locs``)."""

    plan: BatchPlan
    current: bool


class PlanMemo:
    """The last ``max_entries`` plans of at most ``max_tokens`` tokens each, by their call's arguments.

    An entry keeps the allocator's change count when it was made and, for ``balanced``, its free pages per
    lane; it is returned for a call with equal arguments while the free pages are equal (``balanced``) or
    always (other policies). The memory it keeps alive is bounded: ``max_entries * max_tokens`` tokens of
    plans (about 28 B each: owner, gather index and the per-run tables).

    Args:
        max_entries: plans kept (oldest dropped first). max_tokens: larger plans are not kept, in tokens.
    """

    def __init__(self, max_entries: int = 16, max_tokens: int = 1 << 15) -> None:
        self.max_entries, self.max_tokens = max_entries, max_tokens
        self._plans: OrderedDict[bytes, tuple[BatchPlan, int, bytes]] = OrderedDict()

    @staticmethod
    def key(prefix_lens: np.ndarray, extend_lens: np.ndarray, last_locs: np.ndarray) -> bytes:
        """The arguments (int64 ``[B]`` each, checked) as one key: three arrays of one length, so unambiguous."""
        return prefix_lens.tobytes() + extend_lens.tobytes() + last_locs.tobytes()

    def get(self, key: bytes, changes: int, free: bytes) -> MemoHit | None:
        """The plan kept for ``key`` if still valid: ``free`` (free pages per lane as bytes, ``b""`` when the
        policy does not read them) equal to when it was kept; ``changes`` (the allocator's count of page
        changes) tells whether ``last_locs`` must be checked again."""
        hit = self._plans.get(key)
        if hit is None or hit[2] != free:
            return None
        return MemoHit(hit[0], hit[1] == changes)

    def kept(self, key: bytes) -> BatchPlan | None:
        """The plan kept for ``key`` whatever the free pages it was made with (``balanced``: the caller
        compares its phases with the ones it would choose now; equal phases give the same plan)."""
        hit = self._plans.get(key)
        return None if hit is None else hit[0]

    def drop(self, key: bytes) -> None:
        """Forget the plan of ``key`` (it was allocated: the same arguments will not come again)."""
        self._plans.pop(key, None)

    def put(self, key: bytes, plan: BatchPlan, changes: int, free: bytes) -> None:
        """Keep ``plan`` (unless larger than ``max_tokens``), dropping the oldest entry beyond ``max_entries``."""
        if plan.num_tokens > self.max_tokens:
            return
        self._plans[key] = (plan, changes, free)
        self._plans.move_to_end(key)
        if len(self._plans) > self.max_entries:
            self._plans.popitem(last=False)
