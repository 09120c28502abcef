"""C-ZIGZAG's segment tables stay small at any cp_size: cached only up to ``_TABLE_MAX_CP`` lanes (O(C**2)
bytes each), computed per batch above it; both ways give the oracle's plan (limits.MAX_CP_SIZE promises a
one-request plan of about 650 KiB at 4096 lanes; the tables alone took 768 MiB there)."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import CPConfig, plan_batch, plan_request
from cpkv import planner as planner_mod

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ZIGZAG")]


def test_a_plan_at_max_cp_size_builds_no_quadratic_table():
    cfg = CPConfig(4096, 64, "rotation", "zigzag")
    tracemalloc.start()
    try:
        plan = plan_request(0, 1000, cfg, req_index=4095)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20  # was 768 MiB of fill and lanes tables
    assert 4096 not in planner_mod._SEGMENT_TABLES
    # 16 pages in segments 0..15, one page each, on zigzag ranks 0..15, lanes (z + 4095) % 4096
    assert plan.page_owners.tolist() == [4095] + list(range(15))
    assert plan.page_owners.tolist() == oracle.plan_request(0, 1000, 4096, 64, 4095)["page_owners"]


@settings(max_examples=150, deadline=None)
@given(C=st.integers(1, 80), P=st.sampled_from([1, 3, 16]), data=st.data())
def test_computed_rows_equal_the_cached_tables_and_the_oracle(C, P, data):
    B = data.draw(st.integers(1, 4), label="B")
    L0 = data.draw(st.lists(st.integers(0, 200), min_size=B, max_size=B), label="L0")
    E = data.draw(st.lists(st.integers(0, 6 * C * P + 5), min_size=B, max_size=B), label="E")
    heads = [0 if (p % P and e) else None for p, e in zip(L0, E, strict=True)]
    cfg = CPConfig(C, P, "rotation", "zigzag")
    got = plan_batch(L0, E, cfg, head_owners=[-1 if h is None else h for h in heads])
    old = planner_mod._TABLE_MAX_CP
    try:  # the other way of the two: computed rows at C <= 64, tables above
        planner_mod._TABLE_MAX_CP = 4096 if C > old else 0
        other = plan_batch(L0, E, cfg, head_owners=[-1 if h is None else h for h in heads])
    finally:
        planner_mod._TABLE_MAX_CP = old
    for name in ("page_owners", "token_owner", "per_rank_tokens", "last_token_owner"):
        assert np.array_equal(getattr(got, name), getattr(other, name)), name
    for name in ("req", "owner", "length", "pages"):
        assert np.array_equal(getattr(got.token_runs, name), getattr(other.token_runs, name)), name
    want = oracle.plan_batch(L0, E, C, P, heads)
    assert got.token_owner.tolist() == want["token_owner"]
    assert got.page_owners.tolist() == want["page_owners"]


def test_no_cache_holds_more_than_o_c_per_cp_size_after_many_cp_sizes(monkeypatch):
    # a sweep-like process: plans under many cp_sizes and both strategies, then reads what stayed cached
    # (fresh caches: a test above builds tables directly to compare them)
    from cpkv import interleave as interleave_mod

    monkeypatch.setattr(planner_mod, "_SEGMENT_TABLES", {})
    monkeypatch.setattr(interleave_mod, "_CYCLIC", {})
    for C in (8, 63, 64, 65, 100, 1000, 4096):
        for strategy in ("zigzag", "interleave"):
            plan_request(0, 64 * 3 * C + 7, CPConfig(C, 64, "rotation", strategy), req_index=1)
    # zigzag: O(C**2) tables only up to _TABLE_MAX_CP lanes (a constant 195 KiB at most), nothing above
    assert planner_mod._SEGMENT_TABLES and max(planner_mod._SEGMENT_TABLES) <= planner_mod._TABLE_MAX_CP
    assert 65 not in planner_mod._SEGMENT_TABLES and 4096 not in planner_mod._SEGMENT_TABLES
    # interleave: the cyclic owner tables of the 4 most recent cp_sizes, each O(pages + C), none O(C**2)
    assert len(interleave_mod._CYCLIC) <= interleave_mod._CYCLIC_TABLES
    for C, table in interleave_mod._CYCLIC.items():
        assert table.ndim == 1 and table.shape[0] <= interleave_mod._CYCLIC_MAX + C
