"""Plan, then commit: what ``OwnerLaneAllocator.plan_extend`` records of a plan and how ``allocate`` checks it
(SPEC C-ALLOC, C-BALANCED).

A plan is a function of its lengths, its ``last_locs`` (head owners) and, under ``balanced``, the free
pages per lane it was made under. ``allocate`` commits a plan only while it is the one ``plan_extend``
would make now, and only once: a plan of another allocator, of other ``last_locs``, already committed, or
(``balanced``) whose phases the current free pages no longer choose is refused before any page is taken.

The allocator keeps, per plan object it made, the state the plan was made under (``PlanStamp``, in a weak
table keyed by the plan) and the set of those not yet committed (a weak set), so the ``BatchPlan`` type
carries no allocator state. Only the plan object ``plan_extend`` returned commits: a copy (``copy.copy``,
``dataclasses.replace``, ``copy.deepcopy``, an unpickled plan) is another object, never in the table, and is
refused. The tables hold no plan alive: a plan dropped by its caller drops out of both.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..config import CPConfig
from ..errors import StalePlanError
from ..plan import BatchPlan
from ..policy import balanced_phases
from ..validate import as_int_array
from .checks import head_owners
from .pool import LanePool

_I64 = np.int64


class PlanStamp:
    """The state a plan was made under: its ``last_locs`` (bytes of int64 ``[B]``), the pool's change count,
    and (``balanced``) the free pages per lane as bytes, else None."""

    __slots__ = ("last_locs", "changes", "free")

    def __init__(self, last_locs: bytes, changes: int, free: bytes | None) -> None:
        self.last_locs, self.changes, self.free = last_locs, changes, free


class Commits:
    """The plans one allocator made and committed: ``stamp`` records a new plan, ``check`` admits it once.

    Args:
        config: the allocator's ``CPConfig``. pool: its ``LanePool``.
    """

    def __init__(self, config: CPConfig, pool: LanePool) -> None:
        self.config, self.pool = config, pool
        # plan -> its PlanStamp
        self._stamps: weakref.WeakKeyDictionary[BatchPlan, PlanStamp] = weakref.WeakKeyDictionary()
        self._open: weakref.WeakSet[BatchPlan] = weakref.WeakSet()  # the plans made and not yet committed

    # a copied or unpickled allocator commits its own plans, none yet
    def __getstate__(self) -> dict[str, object]:
        return {"config": self.config, "pool": self.pool}

    def __setstate__(self, state: dict[str, Any]) -> None:  # the dict __getstate__ returned
        Commits.__init__(self, state["config"], state["pool"])

    def stamp(self, plan: BatchPlan, last: np.ndarray, balanced: bool) -> None:
        """Record ``plan``, made now with ``last`` (int64 ``[B]`` ``last_locs``), as open for one commit."""
        free = self.pool.free.tobytes() if balanced else None
        self._stamps[plan] = PlanStamp(last.tobytes(), self.pool.changes, free)
        self._open.add(plan)

    def current(self, plan: BatchPlan, last: np.ndarray) -> bool:
        """Whether ``check(plan, last)`` would admit ``plan`` now (``last``: int64 ``[B]`` as planned); raises
        nothing, changes nothing."""
        stamp = self._stamps.get(plan)
        if stamp is None or plan not in self._open or last.tobytes() != stamp.last_locs:
            return False
        if stamp.changes == self.pool.changes:
            return True
        C, P = self.config.cp_size, self.config.page_size
        if self.pool.valid_last_locs(plan.prefix_lens, last, P) is None:  # a last_loc on a page freed since
            return False
        if stamp.free is None or stamp.free == self.pool.free.tobytes():
            return True
        phases = balanced_phases(
            plan.prefix_lens, plan.extend_lens, self.pool.free, P, C, self.config.cp_strategy
        )
        return phases.tobytes() == plan.request_phases.tobytes()

    def check(self, plan: BatchPlan, last_locs: object) -> np.ndarray:
        """``last_locs`` as int64 ``[B]`` when ``plan`` may be committed now, else StalePlanError (or the
        AllocatorError of a ``last_loc`` on a page freed since); changes nothing."""
        stamp = self._stamps.get(plan) if isinstance(plan, BatchPlan) else None
        if stamp is None:
            raise StalePlanError(
                "allocate takes a plan this allocator's plan_extend made, that object itself (a copy of it is "
                "refused); plan the batch with it"
            )
        if plan not in self._open:
            raise StalePlanError("the plan was allocated already (a plan commits once); plan the batch again")
        last = as_int_array("last_locs", last_locs, plan.num_requests)
        if last.tobytes() != stamp.last_locs:
            made = np.frombuffer(stamp.last_locs, dtype=_I64).tolist()
            raise StalePlanError(
                f"last_locs {last.tolist()} differ from the plan's {made}; plan the batch again"
            )
        if stamp.changes != self.pool.changes:
            head_owners(self.pool, self.config, plan.prefix_lens, last)  # raises on a last_loc freed since
            if stamp.free is not None and stamp.free != self.pool.free.tobytes():
                C, P = self.config.cp_size, self.config.page_size
                phases = balanced_phases(
                    plan.prefix_lens, plan.extend_lens, self.pool.free, P, C, self.config.cp_strategy
                )
                if phases.tobytes() != plan.request_phases.tobytes():
                    raise StalePlanError(
                        f"the free pages per lane changed since the plan was made ({self.pool.free.tolist()} now) and "
                        f"choose phases {phases.tolist()}, not the plan's {plan.request_phases.tolist()}; plan again"
                    )
        return last

    def committed(self, plan: BatchPlan) -> None:
        """``plan`` was allocated: it commits no second time."""
        self._open.discard(plan)
