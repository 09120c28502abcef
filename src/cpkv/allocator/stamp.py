"""Plan, then commit: what ``OwnerLaneAllocator.plan_extend`` records on a plan and how ``allocate`` checks it
(SPEC C-ALLOC, C-BALANCED).

A plan is a function of its lengths, its ``last_locs`` (head owners) and, under ``balanced``, the free
pages per lane it was made under. ``allocate`` commits a plan only while it is the one ``plan_extend``
would make now, and only once: a plan of another allocator, of other ``last_locs``, already committed, or
(``balanced``) whose phases the current free pages no longer choose is refused before any page is taken.

Once, however the plan was copied: the allocator keeps a weak table of its open stamps (made, not yet
committed), keyed by serial. A shallow copy (``copy.copy``, ``dataclasses.replace``) shares its plan's
stamp object, so after either commits the stamp is closed for both; a deep copy or an unpickled plan holds
another stamp object, never the open one, and is refused. The table holds no plan alive: a stamp no plan
references any more drops out of it.
"""

from __future__ import annotations

import itertools
import weakref

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
    """A plan's maker (an allocator's token), its serial (unique per allocator), its ``last_locs`` (bytes), the
    pool's change count when it was made, and (``balanced``) the free pages per lane as bytes, else None.
    Compared by identity: only the stamp object ``plan_extend`` made is open for a commit."""

    __slots__ = ("maker", "serial", "last_locs", "changes", "free", "__weakref__")

    def __init__(
        self, maker: object, serial: int, last_locs: bytes, changes: int, free: bytes | None
    ) -> None:
        self.maker, self.serial, self.last_locs, self.changes, self.free = (
            maker,
            serial,
            last_locs,
            changes,
            free,
        )

    def __reduce__(self):  # a pickled or deep-copied stamp is another object: never the open one
        return PlanStamp, (None, self.serial, self.last_locs, self.changes, self.free)


class Commits:
    """The plans one allocator made and committed: ``stamp`` marks a new plan, ``check`` admits it once.

    Args:
        config: the allocator's ``CPConfig``. pool: its ``LanePool``.
    """

    def __init__(self, config: CPConfig, pool: LanePool) -> None:
        self.config, self.pool = config, pool
        self.maker = object()
        self._serials = itertools.count()
        self._open: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # serial -> open stamp

    def __getstate__(self) -> dict:  # a copied or unpickled allocator commits its own plans, none yet
        return {"config": self.config, "pool": self.pool}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["config"], state["pool"])

    def stamp(self, last: np.ndarray, balanced: bool) -> PlanStamp:
        """The stamp of a plan made now with ``last`` (int64 ``[B]`` ``last_locs``)."""
        free = self.pool.free.tobytes() if balanced else None
        stamp = PlanStamp(self.maker, next(self._serials), last.tobytes(), self.pool.changes, free)
        self._open[stamp.serial] = stamp
        return stamp

    def check(self, plan: BatchPlan, last_locs) -> np.ndarray:
        """``last_locs`` as int64 ``[B]`` when ``plan`` may be committed now, else StalePlanError (or the
        AllocatorError of a ``last_loc`` on a page freed since); changes nothing."""
        stamp = plan.stamp if isinstance(plan, BatchPlan) else None
        if isinstance(stamp, PlanStamp) and stamp.maker is None:
            raise StalePlanError(
                f"the plan (serial {stamp.serial}) is a deep copy or an unpickled copy, not the plan plan_extend "
                "made; commit that plan or plan the batch again"
            )
        if not isinstance(stamp, PlanStamp) or stamp.maker is not self.maker:
            raise StalePlanError(
                "allocate takes a plan this allocator's plan_extend made; plan the batch with it"
            )
        if self._open.get(stamp.serial) is not stamp:
            raise StalePlanError(
                f"the plan (serial {stamp.serial}) was allocated already, by it or a copy (a plan commits once); "
                "plan the batch again"
            )
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
        """``plan`` was allocated: it and every copy of it commit no second time (its stamp is closed)."""
        self._open.pop(plan.stamp.serial, None)
