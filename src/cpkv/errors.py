"""Typed errors of cpkv (SPEC C-FAIL-FAST).

Every error names the offending value, and where it concerns one request of a batch, the request's
index, so a scheduler log line is enough to find the bad input. Input errors are ``ValueError``
subclasses (SPEC section 7), so callers that only know the standard library still catch them.
"""

from __future__ import annotations


class CpkvError(Exception):
    """Base class of every error raised by cpkv."""


class InputError(CpkvError, ValueError):
    """Bad command-line or grid input (a file, a flag combination, a setting's value): ``cpkv`` exits 2 with
    this one-line message (e.g. ``give --trace or --workload, not both (got --workload synthetic)``)."""


class PlanError(CpkvError, ValueError):
    """Invalid planner input: a length, size, index or array shape (SPEC C-FAIL-FAST)."""


class ConfigError(PlanError):
    """Invalid configuration: ``cp_size``, ``page_size``, owner policy or ``CPKV_OWNER_POLICY``."""


class UnsupportedPagePlan(PlanError):
    """A plan that cpkv cannot express, raised at plan time before any page is taken (SPEC C-HEAD).

    Raised, for example, when ``prefix_len % page_size != 0`` and the request computes head tokens but
    no head owner (the lane of the partly filled last prefix page) was given.
    """


class LayoutError(CpkvError, ValueError):
    """A slot outside the pool, or a translation result that does not fit the input dtype (C-LAYOUT)."""


class PoolKindError(LayoutError):
    """An owner translation (lane, owned mask) asked of a replicated KV pool, which has no owners (C-POOL).

    The message names the translation and the pool; a replicated pool's slots translate as with
    ``cp_size`` 1 (``read_slots``/``write_slots`` return the slot itself)."""


class AllocatorError(CpkvError, ValueError):
    """Invalid allocator call: bad ``last_loc``, freeing page 0, a free page or an out-of-range id."""


class StalePlanError(AllocatorError):
    """``OwnerLaneAllocator.allocate`` was handed a plan it would no longer make: made by another allocator,
    with other ``last_locs``, or (``balanced``) under free pages that now choose other phases. Plan again
    (``plan_extend``); nothing was allocated."""


class PrefixCacheError(CpkvError, ValueError):
    """Invalid prefix-cache or host-tier call (SPEC C-RELOAD): a lane out of range, a stale match or
    handle, an unlock without lock, misaligned or already-cached slots, a missing or duplicate host copy.
    The message names the offending value."""


class LaneExhausted(CpkvError, RuntimeError):
    """A lane has fewer free pages than one allocation call needs (SPEC C-ATOMIC).

    Nothing was allocated. Attributes: ``lane`` (int, the first short lane), ``needed`` (pages the call
    needs on that lane), ``available`` (free pages the lane had).
    """

    def __init__(self, lane: int, needed: int, available: int) -> None:
        self.lane = int(lane)
        self.needed = int(needed)
        self.available = int(available)
        super().__init__(
            f"lane {self.lane} exhausted: the call needs {self.needed} page{'s' * (self.needed != 1)} on lane "
            f"{self.lane} but only {self.available} {'is' if self.available == 1 else 'are'} free; nothing was "
            f"allocated (free or evict pages of "
            f"lane {self.lane}, or add pages_per_lane)"
        )

    def __reduce__(self) -> tuple[type[LaneExhausted], tuple[int, int, int]]:
        return (type(self), (self.lane, self.needed, self.available))


class KernelError(CpkvError, ValueError):
    """Invalid input to a ``cpkv.kernels`` function (SPEC C-KERNEL): a tensor of the wrong shape, dtype or
    device, an ``out=`` that does not fit, or arrays that do not match the batch plan. Names the value."""


class KernelVersionError(CpkvError, RuntimeError):
    """The kernel stack is missing or too old (SPEC C-KERNEL, ``require_kernel_version``).

    One message names the Triton version found and required and cpkv's kernel ABI found and required, and
    the way out (``pip install '.[gpu]'`` in a cpkv checkout, or ``CPKV_KERNELS=off`` for the numpy/torch path).
    """
