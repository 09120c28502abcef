"""``cpkv.runs``, the run-length toolkit: each helper on its docstring's example, exact values, and the
cases its fast paths branch on (a ramp longer than one ``RAMP`` block, keys past the int16 radix sort)."""

import numpy as np
import pytest

from cpkv.runs import RAMP, TokenRuns, expand_runs, indptr, offsets_within_key, run_starts

pytestmark = pytest.mark.unit


def i64(*values):
    return np.array(values, dtype=np.int64)


def test_run_starts_marks_where_a_value_changes():
    assert run_starts(i64(3, 3, 1, 1, 1, 3)).tolist() == [0, 2, 5]
    assert run_starts(i64(7)).tolist() == [0]
    empty = run_starts(i64())
    assert empty.tolist() == [] and empty.dtype == np.int64


def test_expand_runs_counts_up_or_down_from_each_start():
    starts, lengths = i64(10, 50), i64(2, 3)
    assert expand_runs(starts, lengths).tolist() == [10, 11, 50, 51, 52]
    assert expand_runs(starts, lengths, step=-1).tolist() == [10, 9, 50, 49, 48]
    # An empty run gives nothing and shifts nothing after it.
    assert expand_runs(i64(10, 99, 50), i64(2, 0, 3)).tolist() == [10, 11, 50, 51, 52]
    assert expand_runs(i64(), i64()).tolist() == []


def test_expand_runs_past_one_ramp_block():
    """The ramp is added in blocks of 65,536: the second block must continue the count, not restart it."""
    n = RAMP.shape[0]
    assert n == 65536
    up = expand_runs(i64(7, 3), i64(n + 2, 2))
    assert np.array_equal(up, np.r_[7 + np.arange(n + 2), 3, 4])
    down = expand_runs(i64(100_000, 5), i64(n - 1, 4), step=-1)  # the second run straddles the block edge
    assert np.array_equal(down, np.r_[100_000 - np.arange(n - 1), 5, 4, 3, 2])


def test_ramp_is_a_read_only_count():
    assert RAMP[:4].tolist() == [0, 1, 2, 3] and int(RAMP[-1]) == 65535 and RAMP.dtype == np.int64
    with pytest.raises(ValueError):
        RAMP[0] = 1


def test_offsets_within_key_sum_the_earlier_runs_of_the_same_key():
    # key 1: runs 0, 2, 3 of lengths 2, 3, 1 -> 0, 2, 2 + 3 = 5; key 0: run 1 alone -> 0.
    key, length = i64(1, 0, 1, 1), i64(2, 5, 3, 1)
    assert offsets_within_key(key, length, np.bincount(key, length).astype(np.int64)).tolist() == [0, 0, 2, 5]


def test_offsets_within_key_past_the_int16_sort():
    """40,001 keys do not fit the int16 radix sort; the int64 sort must give the same offsets."""
    key, length = i64(40_000, 3, 40_000, 3), i64(2, 1, 4, 6)
    totals = np.bincount(key, length, minlength=40_001).astype(np.int64)
    assert offsets_within_key(key, length, totals).tolist() == [0, 0, 2, 1]


def test_indptr_is_the_csr_offsets_from_zero():
    assert indptr(i64(2, 0, 3)).tolist() == [0, 2, 2, 5]
    assert indptr(i64()).tolist() == [0]
    assert indptr(i64(4)).dtype == np.int64


def test_token_runs_expand_each_run_from_its_start():
    runs = TokenRuns(req=i64(0, 0, 1), owner=i64(0, 1, 0), length=i64(2, 1, 3), pages=i64(0, 1, 1))
    assert runs.expand(i64(10, 99, 50)).tolist() == [10, 11, 99, 50, 51, 52]


def test_deferred_runs_are_built_once_on_first_read_and_read_only():
    calls = []

    def make():
        calls.append(1)
        return i64(0, 1), i64(1, 0), i64(3, 2), i64(1, 1)

    runs = TokenRuns.deferred(make)
    assert calls == []  # nothing built until a field is read
    assert runs.length.tolist() == [3, 2]
    assert runs.req.tolist() == [0, 1] and runs.owner.tolist() == [1, 0] and runs.pages.tolist() == [1, 1]
    assert calls == [1]
    for arr in (runs.req, runs.owner, runs.length, runs.pages):
        assert not arr.flags.writeable
    assert runs.expand(i64(0, 10)).tolist() == [0, 1, 2, 10, 11]


def test_an_unknown_attribute_names_itself_and_builds_nothing():
    calls = []
    runs = TokenRuns.deferred(lambda: calls.append(1))
    with pytest.raises(AttributeError, match="'TokenRuns' object has no attribute 'lanes'"):
        runs.lanes  # noqa: B018
    assert calls == []
    eager = TokenRuns(req=i64(0), owner=i64(0), length=i64(1), pages=i64(0))
    with pytest.raises(AttributeError, match="no attribute 'lanes'"):
        eager.lanes  # noqa: B018
