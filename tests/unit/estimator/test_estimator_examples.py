"""C-ESTIMATE: MQA-logits buffer elements per rank, hand-computed."""

import numpy as np
import pytest

from cpkv import CPConfig, mqa_logits_elements, plan_batch

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ESTIMATE")]


def test_page_size_one_runs():
    # owners [0,0,1,1,0]: rank 0 runs [0,2) -> 2*2 and [4,5) -> 1*5; rank 1 [2,4) -> 2*4.
    out = mqa_logits_elements(plan_batch([0], [5], CPConfig(2, 1)))
    assert out.dtype == np.int64 and out.tolist() == [9, 8]


def test_prefix_and_head_use_real_phase():
    # C=4, P=64, L0=100, E=200, head owner 1, phase 1: runs lane1 [100,192) (head 28 + page 2),
    # lane 2 [192,256), lane 3 [256,300).
    plan = plan_batch([100], [200], CPConfig(4, 64), head_owners=[1])
    assert mqa_logits_elements(plan).tolist() == [0, 92 * 192, 64 * 256, 44 * 300]


def test_requests_never_merge_across_batch_boundary():
    # Two one-page requests with legacy phase 0: both on lane 0, but runs are per request.
    plan = plan_batch([0, 0], [64, 64], CPConfig(2, 64, "legacy"))
    assert mqa_logits_elements(plan).tolist() == [64 * 64 * 2, 0]


def test_rotation_vs_phase0_undersizing():
    # Request 1 of a batch rotates to lane 1: a phase-0 estimate would put its block on lane 0.
    plan = plan_batch([0, 0], [64, 64], CPConfig(2, 64, "rotation"))
    assert mqa_logits_elements(plan).tolist() == [64 * 64, 64 * 64]


def test_rejects_non_plan():
    with pytest.raises(TypeError, match="BatchPlan"):
        mqa_logits_elements([1, 2])


def test_estimate_overflow_is_a_typed_error():
    from cpkv import PlanError

    plan = plan_batch([10**13], [8 * 10**6], CPConfig(8, 64), head_owners=[0])
    with pytest.raises(PlanError, match="overflows int64"):
        mqa_logits_elements(plan)
