"""``cpkv.cache.results.page_slots``: the slots ``p*P + 0 .. P-1`` of each page, in a new array or written
into ``out`` (then ``out`` itself is returned, every slot written)."""

import numpy as np
import pytest

from cpkv.cache.results import page_slots

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-RELOAD")]


def test_new_array_and_out():
    pages = np.array([3, 5], dtype=np.int64)
    assert page_slots(pages, 4).tolist() == [12, 13, 14, 15, 20, 21, 22, 23]
    row = np.full(10, -7, dtype=np.int64)
    got = page_slots(pages, 4, out=row[:8])
    assert got.tolist() == [12, 13, 14, 15, 20, 21, 22, 23]
    assert np.shares_memory(got, row) and got.shape == (8,)
    assert row.tolist() == [12, 13, 14, 15, 20, 21, 22, 23, -7, -7]
    assert page_slots(pages[:0], 4).shape == (0,)
    assert page_slots(pages[:0], 4, out=row[:0]).shape == (0,)
