"""The admission rules each KV storage design declares by named booleans, not by an owner policy it does not
have (SPEC C-STORAGE; REVIEW change 2): ``KVStorage.per_lane_reservation`` and the allocator's
``replans_after_eviction``; the design's pages (``lanes``) and the one ``stuck_alone`` on its scratch."""

import numpy as np
import pytest

from cpkv import AllocatorError, OwnerLaneAllocator
from cpkv.sim.config import KV_STORAGE_DESIGNS, SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.reservation import stuck_alone
from cpkv.sim.storage import build_storage
from cpkv.sim.trace import Request

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]

POLICIES = ("rotation", "legacy", "balanced")

# (per_lane_reservation, alloc.replans_after_eviction, policy named in rejection messages)
RULES = {
    ("owner-lane", "rotation"): (True, False, "rotation"),
    ("owner-lane", "legacy"): (True, False, "legacy"),
    ("owner-lane", "balanced"): (False, True, "balanced"),
    **{("replicated", p): (False, True, "balanced") for p in POLICIES},
    **{("interleaved-vblock", p): (False, True, "balanced") for p in POLICIES},
    **{("interleaved", p): (True, True, "rotation") for p in POLICIES},
}


def _design(name, cfg, policy):
    return build_storage(name, cfg, policy, PolicyRun(cfg, policy, []).cost)


@pytest.mark.parametrize("design", KV_STORAGE_DESIGNS)
@pytest.mark.parametrize("policy", POLICIES)
def test_each_design_declares_its_admission_rules(design, policy):
    s = _design(design, SimConfig(cp_size=4, page_size=2, pages_per_lane=8), policy)
    got = (s.per_lane_reservation, s.alloc.replans_after_eviction, s.policy)
    assert got == RULES[design, policy]
    assert type(s.per_lane_reservation) is bool and type(s.alloc.replans_after_eviction) is bool


@pytest.mark.parametrize("design", ["replicated", "interleaved", "interleaved-vblock"])
def test_a_storage_allocator_drives_the_designs_lanes(design):
    # ``lanes`` is the design's OwnerLaneAllocator (``pool`` names a LanePool only): the allocator, the
    # prefix cache and the design share it
    s = _design(design, SimConfig(cp_size=4, page_size=2, pages_per_lane=8), "balanced")
    assert isinstance(s.lanes, OwnerLaneAllocator) and s.alloc.lanes is s.lanes
    assert not hasattr(s, "pool") and not hasattr(s.alloc, "pool")
    assert (s.alloc.num_pages, s.alloc.page_size) == (s.lanes.num_pages, s.page_size)
    a = s.alloc.alloc_extend([0], [9], [-1])
    assert s.lanes.used_pages_per_lane().tolist() == s.alloc.used_pages_per_lane().tolist()
    assert int(s.lanes.used_pages_per_lane().sum()) == a.new_pages.shape[0]


def test_stuck_alone_plans_on_the_designs_scratch():
    # C=2, P=1, usable [1, 4] (page 0 is lane 0's): interleaved places a fresh request from the freest lane (1), then 0, 1, 0;
    # holding pages 3 (lane 1, token 0) and 2 (lane 0, token 1) and 5 (lane 1, token 2), its token 3
    # goes to lane 0, whose only usable page it holds -> 0. Owner-lane rotation puts token 3 on lane
    # (3 + 0) % 2 = 1, which has a free page -> -1.
    cfg = SimConfig(cp_size=2, page_size=1, pages_per_lane=[2, 4])
    inter = _design("interleaved", cfg, "rotation")
    assert stuck_alone(inter.scratch_allocator(), np.array([3, 2, 5]), 3, 5) == 0
    owner = _design("owner-lane", cfg, "rotation")
    assert stuck_alone(owner.scratch_allocator(), np.array([3, 2, 5]), 3, 5) == -1
    # the scratch is fresh each time: nothing the call took stays taken
    assert inter.scratch_allocator().total_free_pages == 5


@pytest.mark.parametrize("policy", POLICIES)
def test_interleaved_rejects_what_cannot_run_alone_under_its_own_placement(policy):
    # the same pool: a 4-token prompt takes lanes 1, 0, 1, 0 whatever the run's owner policy; its last token
    # has no page on lane 0 even alone (the message names rotation's rules, which interleaved's admission
    # keeps); a 2-token prompt behind it finishes
    cfg = SimConfig(cp_size=2, page_size=1, pages_per_lane=[2, 4], chunk_size=8, max_batch_tokens=8)
    reqs = [Request(0, 0.0, 4, 1, (1,)), Request(1, 0.0, 2, 1, (5,))]
    m = PolicyRun(cfg, policy, reqs, kv_storage="interleaved").run().metrics
    assert m["rejections"] == {
        "0": "lane: policy rotation puts the next page on lane 0, whose 1 usable pages hold its own pages"
    }
    assert m["requests_finished"] == 1 and not m["livelock_detected"]


def test_interleaved_checks_last_locs_as_the_owner_lane_allocator_does():
    # allocator.checks.head_owners: the same AllocatorError, naming the request and the value
    cfg = SimConfig(cp_size=2, page_size=2, pages_per_lane=8)
    inter = _design("interleaved", cfg, "rotation")
    owner = OwnerLaneAllocator(inter.lanes.config, 8)
    for L0, last, match in [
        (0, 5, r"request 0: prefix_len=0 needs last_loc=-1, got 5"),
        (3, 5, r"request 0: last_loc=5 is inconsistent with prefix_len=3"),
        (2, 5, r"request 0: last_loc=5 lies on page 2, which is free"),
    ]:
        for alloc in (inter.alloc, owner):
            with pytest.raises(AllocatorError, match=match):
                alloc.plan_extend([L0], [1], [last])
