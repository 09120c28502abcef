"""C-ESTIMATE on a RequestPlan (SPEC section 10: "a BatchPlan or a RequestPlan"); mqa_logits_elements once
took a BatchPlan only."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig, mqa_logits_elements, plan_batch, plan_request

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ESTIMATE")]


def test_request_plan_hand_computed():
    # C=4, P=64, L0=100, E=200, head owner 1, phase 1: lane 1 [100,192), lane 2 [192,256), lane 3 [256,300).
    plan = plan_request(100, 200, CPConfig(4, 64, "rotation"), head_owner=1)
    out = mqa_logits_elements(plan)
    assert out.dtype == np.int64 and out.tolist() == [0, 92 * 192, 64 * 256, 44 * 300]


def test_readme_next_step_fresh_request():
    # owners of 100 tokens at C=4, P=64: pages [0, 1] (page 0 full on lane 0, page 1 = 36 tokens on lane 1).
    assert mqa_logits_elements(plan_request(0, 100, CPConfig(4, 64, "rotation"))).tolist() == [
        64 * 64,
        36 * 100,
        0,
        0,
    ]


def test_empty_request_plan():
    assert mqa_logits_elements(plan_request(100, 0, CPConfig(4, 64))).tolist() == [0, 0, 0, 0]


@settings(max_examples=60, deadline=None)
@given(
    cp=st.integers(1, 6),
    page=st.integers(1, 9),
    prefix=st.integers(0, 300),
    extend=st.integers(0, 300),
    req_index=st.integers(0, 7),
    head=st.integers(0, 5),
    strategy=st.sampled_from(["zigzag", "interleave"]),
)
def test_request_plan_equals_its_batch_of_one(cp, page, prefix, extend, req_index, head, strategy):
    cfg = CPConfig(cp, page, "rotation", strategy)
    one = plan_request(prefix, extend, cfg, req_index=req_index, head_owner=head % cp)
    batch = plan_batch([prefix], [extend], cfg, head_owners=[head % cp], phases=[one.phase])
    assert mqa_logits_elements(one).tolist() == mqa_logits_elements(batch).tolist()
