"""Test helper: a comparable snapshot of an ``OwnerLaneAllocator``'s whole state (C-ATOMIC checks)."""

import numpy as np

from cpkv import OwnerLaneAllocator


def snapshot(alloc: OwnerLaneAllocator) -> tuple:
    """Everything observable about the free lists, plus the internal free bitmap."""
    return (
        alloc.state_digest(),
        alloc.free_pages_per_lane().tolist(),
        alloc.is_free(np.arange(alloc.num_pages)).tolist(),
        alloc.pool.is_held(np.arange(alloc.num_pages + 1)).tobytes(),
    )
