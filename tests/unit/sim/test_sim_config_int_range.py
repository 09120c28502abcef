"""SimConfig and the workload builder at the int64 edge (C-FAIL-FAST): sizes of arrays beyond int64 are a
ConfigError naming the field and value; budgets and the seed, which size no array, stay unbounded."""

import pytest

from cpkv import ConfigError
from cpkv.sim.config import SimConfig
from cpkv.sim.workload import REQUEST_BYTES, build_workload

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-FAIL-FAST")]

HUGE = 10**20


@pytest.mark.parametrize("field", ["page_size", "host_pages_per_lane", "spec_draft_tokens", "pages_per_lane"])
def test_array_sizes_beyond_int64_are_config_errors(field):
    with pytest.raises(
        ConfigError, match=rf"^{field} must be <= 9223372036854775807 \(the int64 maximum\), got {HUGE}$"
    ):
        SimConfig(**{field: HUGE})


@pytest.mark.parametrize("field", ["chunk_size", "max_batch_tokens", "max_running", "livelock_steps", "seed"])
def test_budgets_and_seed_stay_unbounded(field):
    assert getattr(SimConfig(**{field: HUGE}), field) == HUGE  # accepted before the int64 checks too


@pytest.mark.parametrize("name", ["synthetic", "tiny-chunks", "tiny-chunks-reload", "short-prompts"])
@pytest.mark.parametrize("n", [2**62, 2**63 - 1])
def test_a_count_too_large_to_generate_is_a_config_error(name, n):
    with pytest.raises(
        ConfigError, match=f"a {name} workload of {n:,} requests would need {REQUEST_BYTES * n:,} bytes"
    ):
        build_workload(name, num_requests=n)


def test_num_requests_beyond_int64_names_the_value():
    with pytest.raises(ConfigError, match=f"num_requests must be <= 9223372036854775807 .*got {HUGE}"):
        build_workload("synthetic", num_requests=HUGE)
