"""The replicated design (SPEC C-STORAGE): at C=1 it is owner-lane at C=1, every report field alike."""

import pytest

from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.workload import build_workload

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]


@pytest.mark.parametrize(
    ("workload", "settings_"),
    [
        ("synthetic", dict(pages_per_lane=300, chunk_size=512)),
        ("tiny-chunks-reload", dict(colocated_decode=True)),
        (
            "synthetic",
            dict(
                pages_per_lane=200,
                chunk_size=256,
                spec_draft_tokens=3,
                host_pages_per_lane=64,
                logits_budget_mb=1.0,
            ),
        ),
    ],
)
def test_replicated_at_one_rank_is_owner_lane_at_one_rank(workload, settings_):
    spec = build_workload(workload, num_requests=40, seed=2)
    cfg = SimConfig.for_workload(spec, cp_size=1, page_size=16, **settings_)
    a = PolicyRun(cfg, "balanced", spec.requests).run()
    b = PolicyRun(cfg, "balanced", spec.requests, kv_storage="replicated").run()
    for m in (a.metrics, b.metrics):
        m.pop("sim_wall_s")
    assert a.metrics.pop("kv_storage") == "owner-lane" and b.metrics.pop("kv_storage") == "replicated"
    assert a.metrics == b.metrics  # every report field
    assert a.times_ms.tolist() == b.times_ms.tolist() and a.used.tolist() == b.used.tolist()
    assert a.metrics["evicted_pages"] > 0 or a.metrics["cache_hit_tokens"] > 0  # the cache was exercised
