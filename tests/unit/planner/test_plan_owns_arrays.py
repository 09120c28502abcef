"""A plan owns its arrays: the caller's input arrays are neither aliased nor made read-only (SPEC section 10)."""

import numpy as np
import pytest

from cpkv import CPConfig, OwnerLaneAllocator, plan_batch

pytestmark = pytest.mark.unit


def test_plan_batch_leaves_the_callers_arrays_alone():
    L0, E = np.zeros(2, np.int64), np.array([10, 20], np.int64)
    plan = plan_batch(L0, E, CPConfig(2, 4))
    assert L0.flags.writeable and E.flags.writeable
    L0[:], E[:] = 5, 7  # the caller reuses its buffers
    assert plan.prefix_lens.tolist() == [0, 0] and plan.extend_lens.tolist() == [10, 20]
    assert not plan.prefix_lens.flags.writeable


@pytest.mark.parametrize("E", [[3, 30], [3, 1]], ids=["general path", "single-page path"])
def test_alloc_extend_leaves_the_callers_arrays_alone(E):
    alloc = OwnerLaneAllocator(CPConfig(2, 4), 16)
    L0, E, last = np.zeros(2, np.int64), np.array(E, np.int64), np.full(2, -1, np.int64)
    res = alloc.alloc_extend(L0, E, last)
    assert L0.flags.writeable and E.flags.writeable and last.flags.writeable
    want = res.plan.extend_lens.tolist()
    E[:] = 0
    assert res.plan.extend_lens.tolist() == want
