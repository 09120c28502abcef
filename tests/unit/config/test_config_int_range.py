"""The shared int validators (``cpkv.config``): int64 range, lanes refused as bools, ``MAX_CP_SIZE``
(C-FAIL-FAST). Every CP group (CPConfig, SharedKVLayout, HostTier, SimConfig) takes its cp_size through
``check_cp_size``, so each entry point gets the same limit and the same message."""

import time

import pytest

import cpkv.limits
from cpkv import ConfigError, CPConfig, HostTier, LayoutError, PrefixCacheError, SharedKVLayout
from cpkv.sim.config import SimConfig
from cpkv.validate import INT64_MAX, check_int, check_lane

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-FAIL-FAST")]


def test_int64_max_is_the_numpy_bound():
    import numpy as np

    assert INT64_MAX == int(np.iinfo(np.int64).max)


@pytest.mark.parametrize("value", [INT64_MAX + 1, 10**20, 10**30])
def test_check_int_refuses_values_above_int64_naming_them(value):
    with pytest.raises(
        ConfigError, match=rf"^page_size must be <= {INT64_MAX} \(the int64 maximum\), got {value}$"
    ):
        check_int("page_size", value, 1)
    assert check_int("page_size", INT64_MAX, 1) == INT64_MAX  # the boundary itself fits
    assert check_int("seed", value, 0, None) == value  # unbounded on request (a seed sizes no array)


def test_check_int_raises_the_error_it_is_given():
    from cpkv import AllocatorError

    with pytest.raises(AllocatorError, match="k must be <= 3, got 4"):
        check_int("k", 4, 1, 3, AllocatorError)


def test_page_size_above_int64_is_a_config_error():
    with pytest.raises(ConfigError, match=f"page_size must be <= {INT64_MAX}.*got {10**20}"):
        CPConfig(4, 10**20)


@pytest.mark.parametrize("bad", [True, False])
def test_a_bool_lane_is_refused_as_a_bool_not_as_out_of_range(bad):
    with pytest.raises(LayoutError, match=rf"^rank must be an integer, got {bad}$"):
        check_lane("rank", bad, 8, LayoutError)
    with pytest.raises(LayoutError, match=rf"^rank must be an integer, got {bad}$"):
        SharedKVLayout(4, 64, 8).owned_mask([5], bad)
    with pytest.raises(PrefixCacheError, match=rf"^lane must be an integer, got {bad}$"):
        HostTier(2, 4).pop("k", bad)


def test_lane_out_of_range_names_the_int():
    import numpy as np

    with pytest.raises(LayoutError, match=r"^rank=9 out of range \[0, 8\)$"):
        check_lane("rank", np.int64(9), 8, LayoutError)
    assert check_lane("rank", np.int32(7), 8) == 7


def test_max_cp_size_is_documented_and_exact():
    assert cpkv.limits.MAX_CP_SIZE == 4096
    assert "MAX_CP_SIZE" in CPConfig.__doc__ and "MAX_CP_SIZE" in SimConfig.__doc__
    assert CPConfig(4096, 64).cp_size == 4096


@pytest.mark.parametrize(
    "make",
    [
        lambda C: CPConfig(C, 64),
        lambda C: SharedKVLayout(C, 64, 8),
        lambda C: HostTier(C, 4),
        lambda C: SimConfig(cp_size=C),
        lambda C: SimConfig.for_workload(_tiny_spec(), cp_size=C),
    ],
)
@pytest.mark.parametrize("C", [4097, 10_000_000, 10**30])
def test_cp_size_above_the_limit_fails_at_once_naming_value_and_limit(make, C):
    start = time.perf_counter()
    with pytest.raises(
        ConfigError, match=rf"^cp_size={C} is above cpkv's limit of 4096 ranks \(cpkv.limits.MAX_CP_SIZE\)$"
    ):
        make(C)
    assert time.perf_counter() - start < 1.0  # no per-rank work before the check


def test_cp_size_limit_is_read_at_call_time(monkeypatch):
    monkeypatch.setattr(cpkv.limits, "MAX_CP_SIZE", 8)
    CPConfig(8, 64)
    with pytest.raises(ConfigError, match="cp_size=9 is above cpkv's limit of 8 ranks"):
        CPConfig(9, 64)


def _tiny_spec():
    from cpkv.sim.workload import build_workload

    return build_workload("short-prompts", num_requests=2)
