"""``cpkv.policy``: the owner-policy rules as pure functions, against the oracle (SPEC C-PHASE, C-BALANCED).

The rules take lengths, batch positions and free pages, never an allocator; each is checked against the
oracle's one-candidate-at-a-time reading of the SPEC text, batch requests in order, each seeing the free
pages the earlier ones left.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import CPConfig
from cpkv.policy import balanced_phase, balanced_phases, follows_free_pages, one_page_lanes, rotation_phase

pytestmark = [pytest.mark.unit]


@pytest.mark.clause("C-PHASE")
def test_rotation_phase_on_ints_and_arrays():
    assert rotation_phase(130, 3, 64, 4) == 1  # (2 + 3) % 4
    L0, i = np.array([0, 64, 130, 1000]), np.arange(4)
    assert rotation_phase(L0, i, 64, 4).tolist() == [
        oracle.phase(int(a), 64, int(b), 4) for a, b in zip(L0, i, strict=True)
    ]


@pytest.mark.clause("C-BALANCED")
def test_only_balanced_follows_free_pages():
    assert [follows_free_pages(p) for p in ("rotation", "legacy", "balanced")] == [False, False, True]


@pytest.mark.clause("C-BALANCED")
@settings(max_examples=120, deadline=None)
@given(C=st.integers(1, 5), P=st.sampled_from([1, 4, 16]), data=st.data())
def test_balanced_phases_equal_the_oracle_in_batch_order(C, P, data):
    B = data.draw(st.integers(1, 5), label="B")
    L0 = data.draw(st.lists(st.integers(0, 4 * P), min_size=B, max_size=B), label="L0")
    E = data.draw(st.lists(st.integers(0, 3 * C * P), min_size=B, max_size=B), label="E")
    free = np.array(data.draw(st.lists(st.integers(0, 40), min_size=C, max_size=C), label="free"))
    got = balanced_phases(np.array(L0), np.array(E), free, P, C)
    assert got.tolist() == oracle.balanced_phases(L0, E, C, P, free.tolist())


@pytest.mark.clause("C-BALANCED")
@settings(max_examples=120, deadline=None)
@given(
    C=st.integers(1, 6),
    P=st.sampled_from([1, 4]),
    policy=st.sampled_from(["rotation", "legacy", "balanced"]),
    data=st.data(),
)
def test_one_page_lanes_are_the_phase_of_each_one_page_request(C, P, policy, data):
    B = data.draw(st.integers(1, 8), label="B")
    L0 = np.array(data.draw(st.lists(st.integers(0, 6), min_size=B, max_size=B), label="L0 pages")) * P
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, B - 1), min_size=1), label="rows")))
    free = np.array(data.draw(st.lists(st.integers(0, 20), min_size=C, max_size=C), label="free"))
    decode = data.draw(st.booleans(), label="decode")  # one token each, or a drawn E up to one page
    E = (
        None
        if decode
        else np.array(data.draw(st.lists(st.integers(1, P), min_size=B, max_size=B), label="E"))
    )
    before = free.copy()
    lanes = one_page_lanes(L0, E, rows, free, CPConfig(C, P, policy))
    assert free.tolist() == before.tolist()  # not modified
    if policy != "balanced":
        assert lanes == [oracle.phase(int(L0[i]), P, int(i), C, policy) for i in rows]
        return
    # A request at batch position i taking one new page: a page-aligned prefix, E in 1..P (a full or a partly
    # filled page); the others take none (E = 0).
    Es = np.zeros(B, dtype=np.int64)
    Es[rows] = 1 if E is None else E[rows]
    want = oracle.balanced_phases(L0.tolist(), Es.tolist(), C, P, free.tolist())
    assert lanes == [want[i] for i in rows]


@pytest.mark.clause("C-BALANCED")
def test_a_kept_page_prefers_a_lane_with_a_free_page_when_another_lane_is_short():
    """One kept page, C=4, free [0, 1, -1, 0] (lane 2 short: an earlier request of the batch took more than it
    had, which the simulator's commit evicts for), transient [0, 0, 0, 2]. Criterion 0 read literally lets
    no phase fit, and criterion 1 would pick lane 3 (the most free + transient pages, the oracle's 3), whose
    only pages are transient ones the batch holds; the one-page path keeps the page on a lane with a free
    page, lane 1 (the recorded deviation, gov C-BALANCED; the oracle holds it too). With no lane short
    both readings agree."""
    free, transient = [0, 1, -1, 0], [0, 0, 0, 2]
    assert (
        balanced_phase(list(free), list(transient), 1, 0, False)
        == 1
        == oracle.balanced_phase(0, 4, 4, 4, 0, free, transient)
    )
    g = [f + t for f, t in zip(free, transient, strict=True)]
    assert max(range(4), key=g.__getitem__) == 3  # criterion 1 over every phase (the literal reading): lane 3
    fits = [2, 1, 0, 0]  # no lane short: criterion 0 keeps lanes 0 and 1, the most free + transient wins
    assert (
        balanced_phase(list(fits), [0, 3, 0, 0], 1, 0, False)
        == oracle.balanced_phase(0, 4, 4, 4, 0, fits, [0, 3, 0, 0])
        == 1
    )
