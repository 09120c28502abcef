"""C-BUDGET in the simulator: no prefill step over the MQA-logits budget, single-request steps included.

Expected chunks and estimates are worked out by hand from C-ESTIMATE (a rank's run [a, b) costs
(b - a) * b elements) and C-ZIGZAG; the code under test never computes them.
"""

import pytest

from cpkv import CPConfig, mqa_logits_elements, plan_batch
from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.trace import Request

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-BUDGET")]

ELEMENT_BYTES = 4
MIB = 2**20


def _budget_mb(elements: int) -> float:
    return elements * ELEMENT_BYTES / MIB  # exact in binary: elements * 2**-18


@pytest.mark.parametrize("policy", ["rotation", "legacy", "balanced"])
def test_spec_example_chunks_8_4_2_2(policy, step_log):
    # C=2, P=1, one 16-token prompt, chunk limit 16, budget 26 elements per rank.
    # [0, 16): 4 segments of 4 -> rank 0 runs [0,4),[12,16): 16 + 64 = 80; rank 1 [4,12): 96.  Too big.
    # Aligned chunks end on multiples of 2C = 4 pages: 12 -> rank 0 [0,3),[9,12): 9 + 36 = 45, too big;
    # 8 -> rank 0 [0,2),[6,8): 4 + 16 = 20; rank 1 [2,6): 24.  Fits.
    # [8, 16) -> 2 + ... rank 0 [8,10),[14,16): 20 + 32 = 52, too big; [8,12): rank 0 [8,9),[11,12):
    # 9 + 12 = 21; rank 1 [9,11): 22.  Fits.  [12,16): 13 + 16 = 29 / 30, too big; 3 tokens: rank 1
    # [13,15): 30, too big; 2 tokens: rank 0 [12,13): 13, rank 1 [13,14): 14.  Then [14,16): 15, 16.
    cfg = SimConfig(
        cp_size=2,
        page_size=1,
        pages_per_lane=64,
        chunk_size=16,
        max_batch_tokens=16,
        logits_budget_mb=_budget_mb(26),
    )
    assert cfg.logits_budget_elements == 26
    run = PolicyRun(cfg, policy, [Request(0, 0.0, 16, 1, (7,))])
    log = step_log(run)
    m = run.run().metrics
    assert [s.chunks for s in log] == [[8], [4], [2], [2]]
    assert [sorted(s.logits) for s in log] == [[20, 24], [21, 22], [13, 14], [15, 16]]
    assert m["requests_finished"] == 1 and m["logits_budget_cuts"] == 3  # 16 -> 8, 8 -> 4, 4 -> 2
    assert m["mqa_logits_peak_elements"] == 24 <= m["logits_budget_elements"] == 26


def test_spec_example_nine_tokens_first_would_not_fit():
    # [0, 9): segments 3,2,2,2 -> rank 0 [0,3) and [7,9): 9 + 18 = 27; rank 1 [3,7): 28.
    plan = plan_batch([0], [9], CPConfig(2, 1, "rotation"), phases=[0])
    assert mqa_logits_elements(plan).tolist() == [27, 28]


@pytest.mark.parametrize("policy", ["rotation", "balanced"])
def test_issue_example_64k_prompt_stays_within_64_mib(policy, step_log):
    # C=8, P=64, one 65,536-token prompt, chunk 8,192, 64 MiB = 16,777,216 elements per rank. The old
    # engine checked only batches of several requests: six steps over budget, the worst at 3.8x.
    cfg = SimConfig(cp_size=8, page_size=64, pages_per_lane=4096, chunk_size=8192, logits_budget_mb=64)
    run = PolicyRun(cfg, policy, [Request(0, 0.0, 65_536, 1, tuple(range(128)))])
    log = step_log(run)
    m = run.run().metrics
    budget = 64 * MIB // ELEMENT_BYTES
    assert m["logits_budget_elements"] == budget and m["requests_finished"] == 1
    assert max(max(s.logits) for s in log) == m["mqa_logits_peak_elements"] <= budget
    assert sum(sum(s.chunks) for s in log) == 65_536 and m["logits_budget_cuts"] > 0
    # every chunk that does not finish the prompt ends on a multiple of 2C pages (1,024 tokens) or a page
    ends = [sum(sum(s.chunks) for s in log[: i + 1]) for i in range(len(log))]
    assert all(end % 64 == 0 for end in ends)


def test_request_whose_last_token_exceeds_the_budget_is_rejected_with_reason(step_log):
    # Budget 26: a one-token chunk at position p needs p + 1 elements, so a 40-token prompt's last token
    # (position 39, 40 elements) can never run: rejected when it would be admitted, before any of it is
    # computed (not run up to position 26 and rejected there, nor retried forever); the 6-token prompt runs.
    cfg = SimConfig(
        cp_size=2,
        page_size=1,
        pages_per_lane=64,
        chunk_size=16,
        max_batch_tokens=16,
        logits_budget_mb=_budget_mb(26),
        livelock_steps=8,
    )
    reqs = [Request(0, 0.0, 40, 1, (1,)), Request(1, 0.0, 6, 1, (2,))]
    run = PolicyRun(cfg, "balanced", reqs)
    log = step_log(run)
    m = run.run().metrics
    assert m["rejections"]["0"] == (
        "logits_budget: a one-token chunk at position 39 needs 40 logits elements on "
        "one rank, over the budget of 26"
    )
    assert m["requests_finished"] == 1 and m["requests_rejected"] == 1 and not m["livelock_detected"]
    assert m["rejection_reasons"] == {"logits_budget": 1} and m["prefill_tokens"] == 6
    assert all(max(s.logits) <= 26 for s in log) and all(0 not in s.req_ids for s in log)
    assert run.alloc.used_pages_per_lane().tolist() == run.cache.cached_pages_per_lane().tolist()


def test_every_prompt_longer_than_the_budget_is_rejected_before_admission():
    # Budget 20 elements, two 30-token prompts of one block: each one's last token needs 30, so both are
    # rejected before admission: nothing computed, nothing matched, nothing cached.
    cfg = SimConfig(
        cp_size=2,
        page_size=1,
        pages_per_lane=64,
        chunk_size=4,
        max_batch_tokens=4,
        logits_budget_mb=_budget_mb(20),
    )
    reqs = [Request(0, 0.0, 30, 1, (5,)), Request(1, 1000.0, 30, 1, (5,))]
    run = PolicyRun(cfg, "rotation", reqs)
    m = run.run().metrics
    assert m["requests_finished"] == 0 and m["rejection_reasons"] == {"logits_budget": 2}
    assert m["rejections"]["1"].startswith("logits_budget: a one-token chunk at position 29 needs 30")
    assert m["prefill_tokens"] == 0 and m["cache_hit_tokens"] == 0
    assert run.cache.cached_pages_per_lane().sum() == 0


def test_a_prompt_longer_than_the_budget_is_rejected_at_admission_and_starves_no_one(step_log):
    # Budget 5,242 elements: the last token of a 20,000-token prompt alone needs 20,000 (one token at
    # position p: (p + 1) elements), so the request can never finish; it is rejected before any of it is
    # computed, and the 600-token prompt behind it runs at once (it used to wait while the doomed one
    # advanced one token a step for 3,433 steps).
    budget = 5242
    cfg = SimConfig(cp_size=8, page_size=64, pages_per_lane=512, logits_budget_mb=_budget_mb(budget))
    reqs = [Request(0, 0.0, 20_000, 0, tuple(range(40))), Request(1, 1.0, 600, 0, (100, 101))]
    run = PolicyRun(cfg, "balanced", reqs)
    log = step_log(run)
    m = run.run().metrics
    assert m["rejections"] == {
        "0": "logits_budget: a one-token chunk at position 19999 needs 20000 logits "
        "elements on one rank, over the budget of 5242"
    }
    assert m["requests_finished"] == 1 and m["prefill_tokens"] == 600
    assert all(0 not in s.req_ids for s in log)
