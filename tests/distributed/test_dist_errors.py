"""Failure handling of the CP group: every rank raises the same typed error, nothing hangs.

- a too-small pool: ``LaneExhausted`` with the same lane / needed / available on every rank;
- one rank failing alone (an injected fault): every rank raises it, and the group stays usable;
- the start-up self-check: an all-gather whose slot i does not hold rank i fails loudly on every rank;
- a rank that dies: its peer fails within the collective timeout and the launcher reports it.
"""

import os
import time

import pytest

from cpkv import LaneExhausted
from cpkv.executor import (
    DistCase,
    InjectedFault,
    LaunchError,
    RankGroup,
    RankOrderError,
    TinyDecoderConfig,
    make_workload,
    run_case,
    run_dist,
)
from cpkv.executor.launch import spawn_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

MODEL = TinyDecoderConfig(kv_lora_rank=32, rope_dim=8, num_layers=2)
WORKLOAD = make_workload([0, 20], [40, 30], chunks=2, seed=2)


def test_lane_exhausted_raises_the_same_error_on_every_rank():
    # P=16, Q=1: lane 0 holds only page 0 (reserved), lane 1 one page. Forward 0 fills request 1's
    # 20-token prefix: 2 pages in 2C=4 zigzag segments -> segments 0 and 1 -> owners [0, 1] (phase 0).
    case = DistCase(workload=WORKLOAD, page_size=16, pages_per_lane=1, policy="legacy", model=MODEL)
    t0 = time.monotonic()
    run = run_dist([case], 2, backend="gloo", timeout_s=30, deadline_s=120, check=False)
    assert time.monotonic() - t0 < 120
    errors = run.errors
    assert all(isinstance(e, LaneExhausted) for e in errors), errors
    # Lane 0 needs 1 page, has 0 free; the prefix cache has nothing to evict.
    assert [(e.lane, e.needed, e.available) for e in errors] == [(0, 1, 0)] * 2
    with pytest.raises(LaneExhausted, match="lane 0 exhausted"):
        run.raise_for_error()


def faults_then_recovery(group: RankGroup) -> dict:
    """Rank body: a fault on rank 1 only, then the self-check with ranks swapped, then a good case."""
    out = {}
    try:
        run_case(
            group,
            DistCase(workload=WORKLOAD, page_size=16, model=MODEL, fault_rank=1),
            tag=f"t{os.getppid()}a",
        )
    except InjectedFault as e:
        out["fault"] = (type(e).__name__, e.rank, str(e))
    swapped = RankGroup(
        rank=group.world_size - 1 - group.rank,
        world_size=group.world_size,
        backend=group.backend,
        device=group.device,
    )
    try:
        swapped.self_check()
    except RankOrderError as e:
        out["self_check"] = str(e)
    good = run_case(group, DistCase(workload=WORKLOAD, page_size=16, model=MODEL), tag=f"t{os.getppid()}b")
    out["after"] = good.max_abs_err if group.rank == 0 else good.per_rank_tokens
    return out


def test_one_rank_fails_every_rank_raises_and_group_survives():
    run = spawn_ranks(faults_then_recovery, 2, backend="gloo", timeout_s=30, deadline_s=120)
    outs = [o.result for o in run.outcomes]
    # The fault happened on rank 1 only; rank 0 raised the very same typed error.
    assert [o["fault"] for o in outs] == [
        ("InjectedFault", 1, "injected fault on rank 1 during forward 0 layer 0 attention")
    ] * 2
    # Self-check: every rank saw slot 0 holding rank 1.
    assert all("slot 0 holds rank 1" in o["self_check"] for o in outs)
    # The group kept working: a full case afterwards matches the reference.
    assert outs[0]["after"] <= 1e-5


def dies_on_rank_1(group: RankGroup) -> None:
    if group.rank == 1:
        os._exit(3)
    group.barrier_ok("waiting for rank 1, which died")


def test_dead_rank_is_reported_within_bounded_time():
    t0 = time.monotonic()
    with pytest.raises(
        LaunchError, match=r"ranks \[1\] died .*exit codes \{1: 3\}.*Reports: rank 0: \w*Error"
    ):
        spawn_ranks(dies_on_rank_1, 2, backend="gloo", timeout_s=5, deadline_s=60)
    assert time.monotonic() - t0 < 60
