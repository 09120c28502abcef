"""``cpkv.plan``: the fields and views of ``BatchPlan`` and ``RequestPlan`` on one hand-worked batch, exact
values (SPEC section 10; C-ZIGZAG, C-HEAD, C-BATCH, C-GATHER).

The batch: C=2, P=4, rotation, zigzag; request 0 ``L0=0, E=5``, request 1 ``L0=6, E=4`` with head owner 1.
- request 0: phase (0 // 4 + 0) % 2 = 0; m = ceil(5 / 4) = 2 pages, segments 0 and 1 one page each ->
  owners [0, 1]; positions 0-3 on page 0 (rank 0), position 4 on page 1 (rank 1).
- request 1: phase (6 // 4 + 1) % 2 = 0; h = min(4, 4 - 6 % 4) = 2 head tokens (positions 6, 7) on rank 1;
  m = ceil(10 / 4) - ceil(6 / 4) = 1 page -> owner 0, positions 8, 9.
- flat token_owner [0, 0, 0, 0, 1 | 1, 1, 0, 0]: per rank [6, 3], M = 6.
"""

import numpy as np
import pytest

from cpkv import CPConfig, plan_batch, plan_request

pytestmark = pytest.mark.unit

C4P64 = CPConfig(4, 64, "rotation")


@pytest.fixture
def plan():
    return plan_batch([0, 6], [5, 4], CPConfig(2, 4, "rotation", "zigzag"), head_owners=[-1, 1])


def test_flat_fields(plan):
    assert (plan.num_requests, plan.num_tokens, plan.max_rank_tokens) == (2, 9, 6)
    assert plan.prefix_lens.tolist() == [0, 6] and plan.extend_lens.tolist() == [5, 4]
    assert plan.request_phases.tolist() == [0, 0]
    assert plan.head_owners.tolist() == [-1, 1] and plan.head_tokens.tolist() == [0, 2]
    assert plan.page_owners.tolist() == [0, 1, 0] and plan.page_indptr.tolist() == [0, 2, 3]
    assert plan.extend_indptr.tolist() == [0, 5, 9]
    assert plan.per_request_rank_tokens.tolist() == [[4, 1], [2, 2]]
    assert plan.per_rank_tokens.tolist() == [6, 3]
    assert plan.last_token_owner.tolist() == [1, 0]
    assert plan.req_indices.tolist() == [0, 1]


def test_per_token_arrays_and_pages_per_lane(plan):
    assert plan.token_owner.tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 0]
    assert plan.new_pages_per_lane.tolist() == [2, 1]


@pytest.mark.clause("C-GATHER")
def test_gather_index_is_owner_times_m_plus_rank_within_owner(plan):
    # Rank 0 computes flat tokens 0, 1, 2, 3, 7, 8 (rows 0..5); rank 1 tokens 4, 5, 6 (rows 6 + 0..2).
    assert plan.gather_index.tolist() == [0, 1, 2, 3, 6, 7, 8, 4, 5]


def test_position_runs_merge_within_a_request_only(plan):
    # Request 0 ends on rank 1 (position 4) and request 1 starts on rank 1 (head 6, 7): two runs, not one.
    owner, a, b = plan.position_runs()
    assert owner.tolist() == [0, 1, 1, 0] and a.tolist() == [0, 4, 6, 8] and b.tolist() == [4, 5, 8, 10]
    assert plan.position_runs()[0] is owner  # built once


def test_request_views(plan):
    r0, r1 = plan.requests
    got = (r0.prefix_len, r0.extend_len, r0.req_index, r0.phase, r0.head_owner, r0.head_tokens)
    assert got == (0, 5, 0, 0, None, 0)
    assert r0.page_owners.tolist() == [0, 1] and r0.num_new_pages == 2 and r0.last_token_owner == 1
    assert r1.head_owner == 1 and r1.head_tokens == 2 and r1.page_owners.tolist() == [0]
    assert r1.token_owner.tolist() == [1, 1, 0, 0] and r1.per_rank_tokens.tolist() == [2, 2]
    owner, a, b = r1.position_runs()
    assert owner.tolist() == [1, 0] and a.tolist() == [6, 8] and b.tolist() == [8, 10]


def test_reprs_name_the_sizes_not_the_arrays(plan):
    assert repr(plan) == (
        "BatchPlan(cp_size=2, page_size=4, owner_policy='rotation', cp_strategy='zigzag', requests=2, "
        "tokens=9, new_pages=3, per_rank_tokens=[6, 3])"
    )
    assert repr(plan.requests[1]) == (
        "RequestPlan(prefix_len=6, extend_len=4, req_index=1, phase=0, head_owner=1, new_pages=1, "
        "per_rank_tokens=[2, 2])"
    )


def test_plan_arrays_and_views_are_read_only(plan):
    for arr in (plan.page_owners, plan.token_owner, plan.gather_index, plan.new_pages_per_lane):
        assert not arr.flags.writeable
    assert not plan.requests[0].token_owner.flags.writeable


def test_plans_are_read_only():  # no SPEC clause states it; the docstrings of RequestPlan and BatchPlan do
    p = plan_request(0, 100, C4P64)
    with pytest.raises(ValueError):
        p.token_owner[0] = 3


def test_plan_repr_is_short():  # a convenience, not a SPEC clause
    assert "page_owners" not in repr(plan_batch([0] * 64, [4096] * 64, C4P64))  # no arrays in the repr


def test_an_empty_extend_has_no_last_owner():
    p = plan_request(100, 0, C4P64)
    assert (p.extend_len, p.num_new_pages, p.last_token_owner) == (0, 0, -1)
    assert p.token_owner.tolist() == [] and p.per_rank_tokens.tolist() == [0, 0, 0, 0]
    assert np.array_equal(p.position_runs()[1], np.zeros(0, dtype=np.int64))
