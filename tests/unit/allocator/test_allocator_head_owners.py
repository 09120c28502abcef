"""``head_owners``: a few requests are checked with Python ints, more with one vectorised test; both give
the same lanes and the same AllocatorError (C-FAIL-FAST, C-HEAD)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig, OwnerLaneAllocator
from cpkv.allocator.checks import _FEW, head_owners
from cpkv.errors import AllocatorError

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-FAIL-FAST", "C-HEAD")]


def outcome(pool, config, L0, last):
    try:
        return head_owners(
            pool, config, np.array(L0, dtype=np.int64), np.array(last, dtype=np.int64)
        ).tolist()
    except AllocatorError as e:
        return str(e)


@settings(max_examples=300, deadline=None)
@given(C=st.integers(1, 4), P=st.sampled_from([1, 2, 4]), data=st.data())
def test_a_few_requests_get_what_the_vectorised_check_gives(C, P, data):
    alloc = OwnerLaneAllocator(CPConfig(C, P, "rotation"), 5)
    held = alloc.alloc_pages(data.draw(st.lists(st.integers(0, C - 1), max_size=4), label="held")).tolist()
    B = data.draw(st.integers(1, _FEW), label="B")
    slot = st.one_of(
        st.sampled_from([p * P + j for p in held for j in range(P)] or [-1]),  # on a held page
        st.integers(-3, alloc.num_pages * P + 2),  # anything: free pages, page 0, out of range, < -1
    )
    L0 = data.draw(st.lists(st.integers(0, 3 * P), min_size=B, max_size=B), label="L0")
    last = [data.draw(st.one_of(slot, st.just(-1)), label="last") for _ in L0]
    last = [
        x - (x + 1) % P + n % P if data.draw(st.booleans()) and x >= 0 else x
        for x, n in zip(last, L0, strict=True)
    ]
    few = outcome(alloc.pool, alloc.config, L0, last)
    pad = _FEW + 1 - B  # valid requests after the batch: the same batch through the vectorised check
    many = outcome(alloc.pool, alloc.config, L0 + [0] * pad, last + [-1] * pad)
    assert few == (many[:B] if isinstance(many, list) else many)
