"""Per-rank KV lengths of one request (SPEC C-DRAFT): examples, errors, and a position-by-position reference."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from cpkv import ConfigError, CPConfig, PlanError, rank_kv_lens, verify_rank_kv_lens

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-DRAFT")]


def reference(pages: list[int], length: int, C: int, P: int) -> list[int]:
    """Plain Python: position t lies on the request's page t // P, which lives on lane page % C."""
    out = [0] * C
    for t in range(length):
        out[pages[t // P] % C] += 1
    return out


def test_example_from_the_docstring():
    # C=2, P=4, pages [5, 2, 7] on lanes 1, 0, 1; L=10: page 5 holds positions 0..3 (lane 1), page 2
    # 4..7 (lane 0), page 7 holds 8, 9 (lane 1) -> lane 0: 4, lane 1: 4 + 2 = 6.
    out = rank_kv_lens([5, 2, 7], 10, CPConfig(2, 4))
    assert out.tolist() == [4, 6] and out.dtype == np.int64 and out.shape == (2,)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, [0, 0]), (1, [0, 1]), (4, [0, 4]), (5, [1, 4]), (8, [4, 4]), (12, [4, 8])],
)
def test_lengths_at_page_boundaries(length, expected):
    # Same pages: the first P positions go to lane 1, the next P to lane 0, the last P to lane 1.
    assert rank_kv_lens([5, 2, 7], length, CPConfig(2, 4)).tolist() == expected


def test_inputs_may_be_lists_numpy_or_tensors():
    cfg = CPConfig(4, 4)
    for pages in ([4, 1, 5], np.array([4, 1, 5], dtype=np.int32), torch.tensor([4, 1, 5])):
        assert rank_kv_lens(pages, 9, cfg).tolist() == [4, 5, 0, 0]
        assert verify_rank_kv_lens(pages, 6, 3, cfg).tolist() == [[4, 3, 0, 0], [4, 4, 0, 0], [4, 5, 0, 0]]


def test_verify_rows_are_rank_kv_lens_of_one_more_position_each():
    # C=2, P=4, pages [5, 2, 7], L=7, k=3: positions 7 (page 2, lane 0), 8, 9 (page 7, lane 1).
    rows = verify_rank_kv_lens([5, 2, 7], 7, 3, CPConfig(2, 4))
    assert rows.tolist() == [[4, 4], [4, 5], [4, 6]] and rows.dtype == np.int64


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda c: rank_kv_lens([5, 2], 9, c), PlanError, r"seq_len=9 out of range \[0, 8\]"),
        (lambda c: rank_kv_lens([5, 2], -1, c), PlanError, r"seq_len=-1 must be >= 0"),
        (lambda c: rank_kv_lens([5, -2], 3, c), PlanError, r"page_ids\[1\]=-2 is negative"),
        (lambda c: rank_kv_lens([5, 2], 3.0, c), PlanError, r"seq_len must be an integer, got 3.0"),
        (lambda c: rank_kv_lens([[5, 2]], 3, c), PlanError, r"page_ids must be 1-D"),
        (lambda c: rank_kv_lens([5, 2], 3, (2, 4)), ConfigError, r"config must be a CPConfig, got tuple"),
        (
            lambda c: verify_rank_kv_lens([5, 2], 6, 3, c),
            PlanError,
            r"seq_len \+ num_draft_tokens = 9 out of range",
        ),
        (
            lambda c: verify_rank_kv_lens([5, 2], 6, 0, c),
            PlanError,
            r"num_draft_tokens must be an integer >= 1, got 0",
        ),
    ],
)
def test_errors_name_the_value(call, error, match):
    with pytest.raises(error, match=match):
        call(CPConfig(2, 4))


@given(
    C=st.integers(1, 8),
    P=st.sampled_from([1, 2, 3, 4, 16]),
    data=st.data(),
)
@hsettings(max_examples=200, deadline=None)
def test_matches_position_by_position_count_and_sums_to_length(C, P, data):
    m = data.draw(st.integers(0, 12), label="m")
    pages = data.draw(st.lists(st.integers(1, 500), min_size=m, max_size=m, unique=True), label="pages")
    length = data.draw(st.integers(0, m * P), label="length")
    out = rank_kv_lens(pages, length, CPConfig(C, P))
    assert out.tolist() == reference(pages, length, C, P)
    assert int(out.sum()) == length
    if m * P > length:
        k = data.draw(st.integers(1, m * P - length), label="k")
        rows = verify_rank_kv_lens(pages, length, k, CPConfig(C, P))
        assert rows.shape == (k, C)
        assert rows.tolist() == [reference(pages, length + j + 1, C, P) for j in range(k)]
        assert rows.sum(axis=1).tolist() == [length + j + 1 for j in range(k)]
