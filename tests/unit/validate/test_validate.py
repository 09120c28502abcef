"""``cpkv.validate``: one family of input checks, the error type a parameter (SPEC C-FAIL-FAST).

The fast accepts (``int64_fast``, ``int64_copy``) must give what the full checks give or decline; the
plan-size bound must never be below the exact bytes.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig
from cpkv.errors import AllocatorError, KernelError, PlanError, PrefixCacheError
from cpkv.validate import as_int_array, int64_copy, int64_fast, plan_bytes, plan_bytes_bound

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-FAIL-FAST")]


@pytest.mark.parametrize("error", [PlanError, AllocatorError, PrefixCacheError, KernelError])
@pytest.mark.parametrize(
    ("values", "match"),
    [
        ([1, True], r"pages\[1\] is a bool \(True\), not an integer"),
        ([[1, 2]], r"pages must be 1-D, got shape \(1, 2\)"),
        ([1.5], r"pages must hold integers, got dtype float64: \[1.5\]"),
        ([2**63], "pages holds 9223372036854775808, outside the int64 range"),
        (torch.zeros(2, device="meta", dtype=torch.int64), "pages is a tensor on device meta"),
    ],
)
def test_each_failure_is_the_callers_error_naming_the_value(error, values, match):
    with pytest.raises(error, match=match) as got:
        as_int_array("pages", values, error=error)
    assert type(got.value) is error


def test_length_flatten_and_count_of():
    with pytest.raises(PlanError, match="last_locs has 1 entries but prefix_lens has 2"):
        as_int_array("last_locs", [3], 2)
    with pytest.raises(KernelError, match="new_pages has 1 entries but the plan has 2"):
        as_int_array("new_pages", [3], 2, error=KernelError, count_of="the plan")
    flat = as_int_array("seq_lens_cpu", torch.tensor([[4], [7]], dtype=torch.int32), flatten=True)
    assert flat.dtype == np.int64 and flat.tolist() == [4, 7]


@settings(max_examples=200, deadline=None)
@given(
    values=st.one_of(
        st.lists(st.integers(-(2**64), 2**64), max_size=5),
        st.lists(st.booleans(), max_size=3),
        st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=3),
    )
)
def test_fast_accepts_agree_with_the_full_checks(values):
    try:
        want = as_int_array("x", values)
    except PlanError:
        want = None
    for fast in (int64_fast(values), int64_copy(values)):
        if fast is not None:  # a fast accept is always a valid input, read the same
            assert want is not None and fast.dtype == np.int64 and fast.tolist() == want.tolist()
    arr = np.array([5, -1], dtype=np.int64)
    assert int64_fast(arr) is arr and int64_copy(arr) is not arr and int64_copy(arr).tolist() == [5, -1]
    assert int64_copy(torch.tensor([5], dtype=torch.int64)).tolist() == [5]
    assert int64_copy(torch.tensor([5], dtype=torch.int32)) is None  # declined: the full checks read it


@settings(max_examples=200, deadline=None)
@given(C=st.integers(1, 64), P=st.integers(1, 128), data=st.data())
def test_the_size_bound_is_never_below_the_exact_bytes(C, P, data):
    B = data.draw(st.integers(1, 8))
    L0 = np.array(data.draw(st.lists(st.integers(0, 10**6), min_size=B, max_size=B)), dtype=np.int64)
    E = np.array(data.draw(st.lists(st.integers(0, 10**6), min_size=B, max_size=B)), dtype=np.int64)
    e = int(E.max())
    assert plan_bytes_bound(B, e, e // P + 2, C) >= plan_bytes(L0, E, CPConfig(C, P))[2]
