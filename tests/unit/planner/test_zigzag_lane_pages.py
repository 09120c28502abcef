"""``zigzag_lane_pages`` (the per-lane page counts C-BALANCED and the simulator use) equals the page owners
of the plan itself and of the independent oracle, for every page count, phase and cp_size (SPEC C-ZIGZAG)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import CPConfig, plan_request
from cpkv.policy import zigzag_lane_pages

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ZIGZAG")]


@settings(max_examples=300, deadline=None)
@given(
    C=st.integers(1, 12),
    P=st.sampled_from([1, 3, 16]),
    phase=st.data(),
    L0=st.integers(0, 200),
    E=st.integers(0, 600),
)
def test_counts_equal_the_plans_page_owners(C, P, phase, L0, E):
    f = phase.draw(st.integers(0, C - 1), label="phase")
    plan = plan_request(L0, E, CPConfig(C, P), head_owner=0, phase=f)
    m = plan.num_new_pages
    got = zigzag_lane_pages(m, f, C)
    assert got.dtype == np.int64 and got.tolist() == np.bincount(plan.page_owners, minlength=C).tolist()
    owners = oracle.plan_request(L0, E, C, P, head_owner=0, phase=f)["page_owners"]
    assert got.tolist() == [owners.count(r) for r in range(C)]


@pytest.mark.parametrize("C", [2, 3, 4, 8])
def test_every_remainder_of_a_zigzag_round(C):
    # m = k * 2C + rem for every rem in [0, 2C): the first rem segments get one page more, and segment
    # s >= C is zigzag rank 2C-1-s, so rems above C put a second extra page on the ranks C-1, C-2, ...
    for m in range(0, 4 * C + 1):
        for f in range(C):
            want = [0] * C
            for s, size in enumerate(oracle.segment_sizes(m, C)):
                want[(oracle.zigzag_rank(s, C) + f) % C] += size
            assert zigzag_lane_pages(m, f, C).tolist() == want, (m, f)
