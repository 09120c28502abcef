"""The result of one allocation call: ``ExtendAllocation`` (SPEC section 10)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np

from ..errors import AllocatorError
from ..plan import BatchPlan

if TYPE_CHECKING:
    import torch

__all__ = ["ExtendAllocation"]


class ExtendAllocation:
    """Result of ``alloc_extend`` / ``alloc_decode`` (SPEC section 10); read-only.

    Attributes:
        out_cache_loc: ``[sum E]`` torch.int64 on the allocator's device: the slot of every extend token,
            flattened in request order (head tokens ``last_loc+1 ...``, then ``p*P + 0 .. P-1`` per new page).
            On a CPU allocator it wraps ``out_cache_loc_cpu`` without a copy, made on first access: code
            that reads only numpy (the simulator) never imports torch.
        out_cache_loc_cpu: the same slots as an int64 numpy array ``[sum E]`` on the host: on a CPU
            allocator the very memory of ``out_cache_loc`` (as ``out_cache_loc.numpy()``), a copy from the
            device otherwise.
        plan: the ``BatchPlan`` the pages were allocated for (phases as the policy chose them). When every
            request needed at most one new page (decode steps, small calls; ``one_page.py``) it is built
            on first access, by the same ``plan_batch`` call the general path makes, so it is the same plan.
        new_pages: ``[sum m]`` int64 numpy page ids, flat, request order (``plan.page_owners`` order).
    """

    __slots__ = ("_out", "new_pages", "_plan", "_make_plan")
    _out: torch.Tensor | np.ndarray
    new_pages: np.ndarray
    _plan: BatchPlan | None
    _make_plan: Callable[[], BatchPlan] | None

    def __init__(
        self,
        out_cache_loc: torch.Tensor | np.ndarray,
        plan: BatchPlan | None,
        new_pages: np.ndarray,
        *,
        make_plan: Callable[[], BatchPlan] | None = None,
    ) -> None:
        if (plan is None) == (make_plan is None):
            raise AllocatorError("ExtendAllocation needs exactly one of plan and make_plan")
        for name, value in (
            ("_out", out_cache_loc),
            ("new_pages", new_pages),
            ("_plan", plan),
            ("_make_plan", make_plan),
        ):
            object.__setattr__(self, name, value)

    @property
    def out_cache_loc(self) -> torch.Tensor:
        """``[sum E]`` torch.int64 on the allocator's device (see the class doc)."""
        out = self._out
        if isinstance(out, np.ndarray):
            import torch

            out = torch.from_numpy(out)  # shares the array's memory
            object.__setattr__(self, "_out", out)
        return out

    @property
    def out_cache_loc_cpu(self) -> np.ndarray:
        """``[sum E]`` int64 numpy slots on the host (see the class doc).

        Raises:
            NotImplementedError: from torch, on a ``meta`` allocator (its tensors hold no values to copy).
        """
        out = self._out
        if isinstance(out, np.ndarray):
            return out
        host: np.ndarray = out.cpu().numpy()
        return host

    @property
    def plan(self) -> BatchPlan:
        """The ``BatchPlan`` of the call (built by ``plan_batch`` on first access where it was deferred)."""
        plan = self._plan
        if plan is None:  # deferred: _make_plan is set (__init__ takes exactly one of the two)
            plan = cast("Callable[[], BatchPlan]", self._make_plan)()
            object.__setattr__(self, "_plan", plan)
            object.__setattr__(self, "_make_plan", None)
        return plan

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ExtendAllocation is read-only (cannot set {name!r})")

    def __reduce__(
        self,
    ) -> tuple[type[ExtendAllocation], tuple[torch.Tensor | np.ndarray, BatchPlan, np.ndarray]]:
        """Copy and pickle through the constructor (a deferred plan is built first)."""
        return (ExtendAllocation, (self._out, self.plan, self.new_pages))

    def __repr__(self) -> str:
        device = "cpu" if isinstance(self._out, np.ndarray) else self._out.device
        return (
            f"ExtendAllocation(tokens={self._out.shape[0]}, new_pages={self.new_pages.shape[0]}, "
            f"device={device})"
        )
