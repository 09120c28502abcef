"""The numpy ``out_cache_loc`` reference (``cpkv.slots``) against the per-token oracle (SPEC C-HEAD, C-ALLOC).

``extend_slots`` works from a plan, ``one_page_slots`` without one for batches whose requests each take at
most one new page (its decode form with ``extend_lens=None`` included); all three must give the oracle's
slot of every token.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import CPConfig, plan_batch
from cpkv.slots import extend_slots, one_page_slots

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-HEAD"), pytest.mark.clause("C-ALLOC")]


def test_worked_examples():
    # P=4, one request L0=10, E=8, last_loc 9 (page 2, offset 1): head slots 10, 11, then pages 5 and 2.
    plan = plan_batch([10], [8], CPConfig(2, 4), head_owners=[0])
    assert extend_slots(plan, np.array([9]), np.array([5, 2])).tolist() == [10, 11, 20, 21, 22, 23, 8, 9]
    # P=4, no head, every last page full: the pages' slots in order.
    plan = plan_batch([0], [8], CPConfig(2, 4))
    assert extend_slots(plan, np.array([-1]), np.array([5, 2])).tolist() == [20, 21, 22, 23, 8, 9, 10, 11]
    # P=4: L0 6 (head 2 tokens: 10, 11, then page 7 -> 28) and L0 8 (page 2 -> 8).
    L0, E, nxt = np.array([6, 8]), np.array([3, 1]), np.array([10, 24])
    assert one_page_slots(L0, E, nxt, np.array([0, 1]), np.array([7, 2]), 4).tolist() == [10, 11, 28, 8]
    # Decode: last_loc + 1, except where the token starts a page (request 1: page 2).
    assert one_page_slots(L0, None, nxt.copy(), np.array([1]), np.array([2]), 4).tolist() == [10, 8]


@settings(max_examples=150, deadline=None)
@given(C=st.integers(1, 5), P=st.sampled_from([1, 2, 4, 16]), data=st.data())
def test_one_page_and_planned_slots_equal_the_oracle(C, P, data):
    B = data.draw(st.integers(1, 6), label="B")
    L0 = np.array(
        data.draw(st.lists(st.integers(0, 5 * P), min_size=B, max_size=B), label="L0"), dtype=np.int64
    )
    # At most one new page: E <= the room left in the last prefix page plus one page.
    E = np.array([data.draw(st.integers(0, (-int(x) % P) + P), label="E") for x in L0], dtype=np.int64)
    # A last_loc consistent with each prefix, on a distinct page id (C * 100 + i: far from the new pages).
    last = np.where(L0 > 0, (C * 100 + np.arange(B)) * P + (L0 - 1) % P, -1)
    m = -(-(L0 + E) // P) - -(-L0 // P)
    assert m.max() <= 1
    new_rows = np.flatnonzero(m)
    new_pages = np.array(data.draw(st.permutations(range(1, 1 + new_rows.shape[0]))), dtype=np.int64)
    want = [
        s
        for i in range(B)
        for s in oracle.out_cache_loc(
            int(L0[i]),
            int(E[i]),
            int(last[i]),
            [int(new_pages[np.searchsorted(new_rows, i)])] if m[i] else [],
            P,
        )
    ]
    got = one_page_slots(L0, E, last + 1, new_rows, new_pages, P)
    assert got.tolist() == want
    heads = np.where((L0 % P != 0) & (E > 0), (last // P) % C, -1)
    strategy = data.draw(st.sampled_from(["zigzag", "interleave"]), label="cp_strategy")  # one page: either
    plan = plan_batch(L0, E, CPConfig(C, P, "rotation", strategy), head_owners=heads)
    assert extend_slots(plan, last, new_pages).tolist() == want
    if (L0 > 0).all():  # decode: E = 1 for every request
        m1 = -(-(L0 + 1) // P) - -(-L0 // P)
        rows = np.flatnonzero(m1)
        pages = np.arange(1, 1 + rows.shape[0], dtype=np.int64)
        want1 = [
            oracle.out_cache_loc(
                int(L0[i]), 1, int(last[i]), [int(pages[np.searchsorted(rows, i)])] if m1[i] else [], P
            )[0]
            for i in range(B)
        ]
        assert one_page_slots(L0, None, last + 1, rows, pages, np.array(P)).tolist() == want1
