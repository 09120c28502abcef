"""Admission and chunk sizing on the real per-lane footprint: hand-worked cases.

C-ZIGZAG reminders used below: a chunk of m < 2C new pages puts one page on each of segments 0..m-1;
segment s goes to lane ``(z(s) + phase) % C`` with ``z(s) = s`` for s < C, else ``2C - 1 - s``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import CPConfig, OwnerLaneAllocator
from cpkv.sim.admission import align_chunk
from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.reservation import even_share, pages_to_finish, reservation_short, stuck_alone
from cpkv.sim.trace import Request

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------------------------------- alignment
def test_align_chunk_examples():
    # C=2, P=4, prefix 6: new pages start at token 8; 2C pages = 32 tokens; 8 + 16 = 24 <= 26 -> 18
    assert align_chunk(6, 20, 100, 2, 4) == 18
    # C=2, P=1, prefix 12: 3 tokens end at 15, no 4-page boundary before -> 3; 5 tokens -> 16 -> 4
    assert align_chunk(12, 3, 10, 2, 1) == 3 and align_chunk(12, 5, 10, 2, 1) == 4
    # a chunk that finishes the request is never cut
    assert align_chunk(12, 9, 5, 2, 1) == 5
    # C=2, P=4, prefix 6, n=1: the head page is partly filled, 1 token -> 1
    assert align_chunk(6, 1, 100, 2, 4) == 1
    # not the step's first request: a chunk may not stop inside a page (0: none), but may fill one
    assert (
        align_chunk(6, 1, 100, 2, 4, in_page=False) == 0 and align_chunk(6, 2, 100, 2, 4, in_page=False) == 2
    )
    assert (
        align_chunk(8, 3, 100, 2, 4, in_page=False) == 0 and align_chunk(8, 5, 100, 2, 4, in_page=False) == 4
    )
    assert align_chunk(8, 3, 3, 2, 4, in_page=False) == 3  # finishing is always allowed


def test_later_requests_of_a_step_never_leave_a_head_page(step_log):
    # C=2, P=16, chunk 32, batch 40 tokens, two 64-token prompts: request 0 takes 32 tokens (2 pages);
    # 8 tokens are left, half a page, so request 1 waits instead of leaving a head page that one rank
    # would compute alone in its next step.
    cfg = SimConfig(cp_size=2, page_size=16, pages_per_lane=64, chunk_size=32, max_batch_tokens=40)
    run = PolicyRun(cfg, "rotation", [Request(0, 0.0, 64, 1, (1,)), Request(1, 0.0, 64, 1, (2,))])
    log = step_log(run)
    run.run()
    assert log[0].req_ids == [0] and log[0].chunks == [32]
    assert all((p + n) % 16 == 0 for s in log for p, n in zip(s.prefixes, s.chunks, strict=True))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(1, 200), st.integers(1, 8), st.sampled_from([1, 4, 16]))
def test_align_chunk_is_monotone_and_never_longer(prefix, remaining, cp_size, page_size):
    sizes = [align_chunk(prefix, n, remaining, cp_size, page_size) for n in range(1, remaining + 1)]
    assert all(1 <= s <= n for n, s in zip(range(1, remaining + 1), sizes, strict=True))
    assert sizes == sorted(sizes) and sizes[-1] == remaining


def test_reservation_helpers():
    assert even_share([1, 4, 5, 9], 4).tolist() == [1, 1, 2, 3]
    assert pages_to_finish(10, 6, 4) == 1 and pages_to_finish(8, 0, 4) == 2 and pages_to_finish(8, 8, 4) == 0
    room = np.array([3, 9])
    assert reservation_short([4, 3], room, per_lane=True) == "lane"  # shares 2 + 2 = 4 > 3 on lane 0
    assert reservation_short([4, 3], room, per_lane=False) is None  # only the total (7 <= 12) matters
    assert reservation_short([8, 5], room, per_lane=False) == "total"
    assert reservation_short([8, 5], room, per_lane=True) == "total"  # the total first


# ---------------------------------------------------------------------------------- fault 2, C-BALANCED
@pytest.mark.clause("C-BALANCED")
def test_fault2_spec_example_chunked_prompt_fits_in_the_simulator(step_log):
    # C=2, P=1, Q=5 (free [4, 5]), one 8-token prompt, chunk 3: the old balanced rule livelocked here
    # (lane 0 full of the request's own pages). Chunks 3, 3, 2 (3 tokens end on no 4-page boundary),
    # phases 0, 1, 0, free after each [3, 3], [1, 2], [0, 1] (C-BALANCED's worked example).
    cfg = SimConfig(cp_size=2, page_size=1, pages_per_lane=5, chunk_size=3, max_batch_tokens=3)
    run = PolicyRun(cfg, "balanced", [Request(0, 0.0, 8, 1, (1,))])
    log = step_log(run)
    m = run.run().metrics
    assert [s.chunks for s in log] == [[3], [3], [2]]
    assert [s.phases for s in log] == [[0], [1], [0]]
    assert [s.free_after for s in log] == [[3, 3], [1, 2], [0, 1]]
    assert m["requests_finished"] == 1 and not m["livelock_detected"] and m["owner_lane_exhausted"] == 0


# ---------------------------------------------------------------------------------------------- fault 3
@pytest.mark.parametrize("policy", ["rotation", "legacy", "balanced"])
def test_fault3_admission_prices_the_chunks_it_runs_not_an_unchunked_phase0_prompt(policy):
    # C=2, P=1, Q=5: usable [4, 5], 9 pages. A 9-token prompt as one phase-0 extend has segments 3,2,2,2
    # -> lane 0 gets 3 + 2 = 5 > 4, and the old admission rejected it ("4 on its smallest lane"). Run in
    # chunks of 3 it fits exactly: lane 0 gets 4 pages, lane 1 gets 5.
    cfg = SimConfig(cp_size=2, page_size=1, pages_per_lane=5, chunk_size=3, max_batch_tokens=3)
    m = PolicyRun(cfg, policy, [Request(0, 0.0, 9, 1, (1,))]).run().metrics
    assert m["requests_finished"] == 1 and m["requests_rejected"] == 0
    assert m["lane_pages_peak"] == [4, 5]


def test_stuck_alone_on_a_scratch_pool():
    # C=2, P=1, Q=2: lane 0's only usable page is page 2, lane 1 has pages 1 and 3. A request holding pages
    # [2, 1] (tokens 0, 1) at prefix 2: rotation puts token 2 on lane (2 + 0) % 2 = 0, which it fills
    # alone -> lane 0; balanced picks the lane with a free page (lane 1) -> -1; at prefix 1 (holding only
    # page 2, last page 2) rotation's next lane is 1, free -> -1.
    def scratch(policy):
        return OwnerLaneAllocator(CPConfig(2, 1, policy), 2)

    assert stuck_alone(scratch("rotation"), np.array([2, 1]), 2, 1) == 0
    assert stuck_alone(scratch("balanced"), np.array([2, 1]), 2, 1) == -1
    assert stuck_alone(scratch("rotation"), np.array([2]), 1, 2) == -1


def test_request_that_cannot_run_alone_is_rejected_with_a_lane_reason_not_livelocked():
    # C=2, P=1, Q=2: usable [1, 2]. A 3-token prompt in one-token chunks. Rotation: token t goes to lane
    # t % 2, so token 2 needs lane 0 again, whose only page holds the request's token 0: stuck even
    # alone -> rejected. Legacy: token 1 already needs lane 0. Balanced: token 2 goes to lane 1 (free).
    cfg = SimConfig(cp_size=2, page_size=1, pages_per_lane=2, chunk_size=1, max_batch_tokens=1)
    reqs = [Request(0, 0.0, 3, 1, (1,))]
    for policy, computed in (("rotation", 2), ("legacy", 1)):
        m = PolicyRun(cfg, policy, reqs).run().metrics
        assert m["rejections"] == {
            "0": f"lane: policy {policy} puts the next page on lane 0, whose 1 usable pages hold its own pages"
        }
        assert m["prefill_tokens"] == computed and not m["livelock_detected"]
    m = PolicyRun(cfg, "balanced", reqs).run().metrics
    assert m["requests_finished"] == 1 and m["lane_pages_peak"] == [1, 2]


# ---------------------------------------------------------------------------------------------- fault 1
@pytest.mark.clause("C-BALANCED")
def test_fault1_short_prompts_one_per_batch_leave_a_lane_empty_under_rotation_only():
    # C=4, P=16, Q=10, ten 48-token (3-page) prompts, one per batch. Rotation: prefix 0, batch index 0 ->
    # phase 0; 3 pages on segments 0, 1, 2 -> lanes 0, 1, 2, every time: lane 3 is never used, and the
    # cached pages evict on lanes 0-2 (9 usable pages on lane 0, 10 on lanes 1, 2). Balanced uses lane 3.
    cfg = SimConfig(cp_size=4, page_size=16, pages_per_lane=10)
    reqs = [Request(i, 100.0 * i, 48, 1, (i,)) for i in range(10)]
    rot = PolicyRun(cfg, "rotation", reqs).run().metrics
    assert rot["lane_pages_peak"] == [9, 9, 9, 0] and rot["evicted_pages"] > 0
    bal = PolicyRun(cfg, "balanced", reqs).run().metrics
    assert bal["requests_finished"] == 10 and min(bal["lane_pages_peak"]) >= 7
    assert bal["evicted_pages"] < rot["evicted_pages"]


# ------------------------------------------------------------------------------------ per-lane capacity
def test_unequal_lanes_end_to_end_b19_situation():
    # One rank with less free memory: lanes of 9, 10, 10, 10 pages (usable 8, 10, 10, 10 = 38).
    cfg = SimConfig(cp_size=4, page_size=16, pages_per_lane=[9, 10, 10, 10], chunk_size=64)
    assert cfg.pages_per_lane == (9, 10, 10, 10) and cfg.lane_capacities == (9, 10, 10, 10)
    reqs = [Request(i, 20.0 * i, 100 + 37 * i, 1, (i,)) for i in range(8)]
    for policy in ("rotation", "balanced"):
        run = PolicyRun(cfg, policy, reqs)
        m = run.run().metrics
        assert m["requests_finished"] + m["requests_rejected"] == 8 and not m["livelock_detected"]
        assert all(
            peak <= cap - (r == 0)
            for r, (peak, cap) in enumerate(zip(m["lane_pages_peak"], (9, 10, 10, 10), strict=True))
        )
        assert run.alloc.used_pages_per_lane().tolist() == run.cache.cached_pages_per_lane().tolist()
    assert PolicyRun(cfg, "balanced", reqs).run().metrics["requests_finished"] == 8
