"""How the simulator prices a step (SPEC C-COST): the slowest rank plus the overhead, the step's prefill and
decode plans handed to the cost model, and the illustrative constants unchanged bit for bit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv.config import CPConfig
from cpkv.planner import plan_batch
from cpkv.sim.config import CostModel, SimConfig
from cpkv.sim.cost import IllustrativeCost, step_cost
from cpkv.sim.engine import PolicyRun
from cpkv.sim.trace import Request
from cpkv.sim.workload import build_workload

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-COST")]


def _illustrative_oracle(cost, prefix, extend, C, P, heads, decode_tokens):
    """linear * tokens + attn * causal pairs, token by token from the oracle's owners."""
    tokens, pairs = [0] * C, [0] * C
    if sum(extend):
        batch = oracle.plan_batch(prefix, extend, C, P, heads)
        for req, L0 in zip(batch["requests"], prefix, strict=True):
            for i, r in enumerate(req["token_owner"]):
                tokens[r] += 1
                pairs[r] += L0 + i + 1  # the keys 0 .. position of the query
    out = [cost.linear_ms_per_token * tokens[r] + cost.attn_ms_per_pair * pairs[r] for r in range(C)]
    return [o + cost.linear_ms_per_token * d for o, d in zip(out, decode_tokens, strict=True)]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([1, 2, 3, 8]), st.sampled_from([1, 4, 64]), st.data())
def test_illustrative_cost_is_the_three_constants_bit_for_bit(C, P, data):
    B = data.draw(st.integers(1, 3))
    prefix = [data.draw(st.integers(0, 3000)) for _ in range(B)]
    extend = [data.draw(st.integers(0, 2000)) for _ in range(B)]
    heads = [
        data.draw(st.integers(0, C - 1)) if L0 % P and E else None
        for L0, E in zip(prefix, extend, strict=True)
    ]
    seq = data.draw(st.lists(st.integers(P, 5000), max_size=4))
    cost = CostModel(linear_ms_per_token=data.draw(st.sampled_from([0.1, 0.37])), attn_ms_per_pair=2e-6)
    cfg = CPConfig(C, P, "rotation")
    plan = plan_batch(prefix, extend, cfg, head_owners=[-1 if h is None else h for h in heads])
    decode = plan_batch([s - s % P for s in seq], [1] * len(seq), cfg) if seq else None
    d = decode.per_rank_tokens.tolist() if decode is not None else [0] * C
    ill = IllustrativeCost(cost, C)
    got = ill.step_work(plan, decode)
    assert got.dtype == np.float64 and got.tolist() == _illustrative_oracle(
        cost, prefix, extend, C, P, heads, d
    )
    assert ill.overhead_ms == cost.step_overhead_ms == 2.0
    assert ill.provenance() == {
        "cost_model": "illustrative",
        "linear_ms_per_token": cost.linear_ms_per_token,
        "attn_ms_per_pair": 2e-6,
        "step_overhead_ms": 2.0,
    }


def test_library_default_is_illustrative():
    # SimConfig's defaults keep the unit tests and a library-only install on the constants (no extra needed).
    assert SimConfig().measured is None
    assert isinstance(step_cost(SimConfig()), IllustrativeCost)
    assert isinstance(PolicyRun(SimConfig(cp_size=2), "balanced", []).cost, IllustrativeCost)


class _Recorder:
    """A made-up StepCost: rank r works (r + 1) ms per prefill token and 0.5 ms per decode token."""

    overhead_ms = 3.25

    def __init__(self, C):
        self.C, self.calls = C, []

    def step_work(self, prefill, decode=None):
        work = np.zeros(self.C)
        if prefill is not None:
            work += prefill.per_rank_tokens * np.arange(1, self.C + 1)
        if decode is not None:
            work += 0.5 * decode.per_rank_tokens
        self.calls.append((prefill, decode, work))
        return work

    def provenance(self):
        return {"cost_model": "recorder"}


@pytest.mark.parametrize("colocated_decode", [False, True])
def test_a_step_lasts_the_overhead_plus_its_slowest_rank(colocated_decode):
    C = 4
    requests = [
        Request(req_id=i, arrival_ms=0.0, input_length=300 + 37 * i, output_length=3, hash_ids=(i,))
        for i in range(6)
    ]
    cfg = SimConfig(
        cp_size=C, page_size=16, pages_per_lane=256, chunk_size=256, colocated_decode=colocated_decode
    )
    cost = _Recorder(C)
    run = PolicyRun(cfg, "rotation", requests, cost)
    result = run.run()
    assert result.metrics["requests_finished"] == 6
    steps = [3.25 + float(w.max()) for _, _, w in cost.calls]
    assert result.metrics["sim_time_ms"] == pytest.approx(sum(steps))
    assert len(cost.calls) == result.metrics["steps"]
    decodes = [d for _, d, _ in cost.calls if d is not None]
    assert (len(decodes) > 0) == colocated_decode  # decode steps reach the cost model as their plan
    assert all(int(d.num_tokens) == int(d.num_requests) for d in decodes)  # one token per request
    prefill_work = [w for p, _, w in cost.calls if p is not None]
    assert result.metrics["compute_imbalance"] == pytest.approx(
        sum(w.max() for w in prefill_work) / sum(w.mean() for w in prefill_work)
    )


def test_illustrative_replay_unchanged_through_the_interface():
    # The engine's time is cost.overhead_ms + max(work): for the constants, exactly the former
    # step_overhead_ms + max(step_work(...)), summed in the same order.
    spec = build_workload("tiny-chunks-reload", num_requests=12, seed=3)
    cfg = SimConfig.for_workload(spec, cp_size=4, colocated_decode=True)
    a = PolicyRun(cfg, "balanced", spec.requests).run().metrics
    b = PolicyRun(cfg, "balanced", spec.requests, IllustrativeCost(cfg.cost, 4)).run().metrics
    assert {k: v for k, v in a.items() if k != "sim_wall_s"} == {
        k: v for k, v in b.items() if k != "sim_wall_s"
    }
