"""The offered prefill load against one group's capacity (``cpkv.sim.load``): the prefixes an
unbounded cache would hit (against a brute-force oracle), the step packing priced by hand, the three cases
of the lines, and the burst's prediction against the replay itself."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.sim.config import CostModel, SimConfig
from cpkv.sim.cost import IllustrativeCost
from cpkv.sim.load import Load, ideal_hits, load_lines, offered_load, prefill_ms
from cpkv.sim.replay import replay
from cpkv.sim.trace import Request
from cpkv.sim.workload import build_workload

pytestmark = pytest.mark.unit

B = 512  # tokens per trace block


def _req(i, blocks, length=None, t=0.0):
    return Request(i, t, length if length is not None else B * len(blocks), 1, tuple(blocks))


def test_ideal_hits_examples():
    reqs = [
        _req(0, (1, 2, 3)),
        _req(1, (1, 2, 9)),
        _req(2, (7, 2, 3)),
        _req(3, (1, 2, 3)),
        _req(4, (1, 5), 600),
    ]
    # 1: blocks 1, 2 of request 0; 2: block 2 behind another first block is no prefix; 3: the whole prompt
    # but its last token (1,535 -> 1,472 in whole pages); 4: block 1 (512 tokens)
    assert ideal_hits(reqs, 64) == [0, 1024, 0, 1472, 512]
    assert ideal_hits(reqs, 1) == [0, 1024, 0, 1535, 512]


def _oracle_hits(reqs, P):
    """Brute force: the longest leading block run shared with any earlier prompt, capped and page-floored."""
    out = []
    for i, r in enumerate(reqs):
        best = 0
        for e in reqs[:i]:
            n = 0
            while n < min(len(r.hash_ids), len(e.hash_ids)) and r.hash_ids[n] == e.hash_ids[n]:
                n += 1
            best = max(best, n)
        hit = min(best * B, r.input_length - 1)
        out.append(hit - hit % P)
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=12),
    st.sampled_from([1, 16, 64, 512]),
    st.integers(0, B - 1),
)
def test_ideal_hits_match_the_brute_force_oracle(prompts, P, short):
    reqs = [_req(i, p, B * len(p) - (short if i % 2 else 0)) for i, p in enumerate(prompts)]
    assert ideal_hits(reqs, P) == _oracle_hits(reqs, P)


def _cfg(**kw):
    return SimConfig(cp_size=1, page_size=1, **kw)


def test_prefill_ms_prices_each_step_by_hand():
    cost = CostModel()
    lin, attn, over = cost.linear_ms_per_token, cost.attn_ms_per_pair, cost.step_overhead_ms
    cfg = _cfg(chunk_size=64, max_batch_tokens=128)
    # one request of 100 tokens, nothing cached: [0, 64) then [64, 100); C = 1 computes every pair
    step1 = over + lin * 64 + attn * 64 * 65 / 2
    step2 = over + lin * 36 + attn * 36 * (64 + 100 + 1) / 2
    assert prefill_ms(cfg, IllustrativeCost(cost, 1), [0], [100]).tolist() == pytest.approx(
        [step1 + step2], rel=1e-12
    )
    # with 40 tokens cached the keys start at 40
    one = over + lin * 10 + attn * 10 * (40 + 50 + 1) / 2
    assert prefill_ms(cfg, IllustrativeCost(cost, 1), [40], [10]).tolist() == pytest.approx([one], rel=1e-12)


def test_prefill_ms_packs_steps_as_the_scheduler_does():
    cost = IllustrativeCost(CostModel(linear_ms_per_token=1.0, attn_ms_per_pair=0.0, step_overhead_ms=0.0), 1)
    # 64-token budget a step: request 0 takes the first step, request 1 the second
    assert prefill_ms(_cfg(chunk_size=64, max_batch_tokens=64), cost, [0, 0], [64, 64]).tolist() == [
        64.0,
        128.0,
    ]
    # 128 a step: both share one step of 128 tokens
    assert prefill_ms(_cfg(chunk_size=64, max_batch_tokens=128), cost, [0, 0], [64, 64]).tolist() == [
        128.0,
        128.0,
    ]
    # one request running at a time: the second waits although the step has room
    cfg = _cfg(chunk_size=64, max_batch_tokens=128, max_running=1)
    assert prefill_ms(cfg, cost, [0, 0], [64, 64]).tolist() == [64.0, 128.0]


def _load(**kw):
    base = dict(
        requests=1000,
        span_s=250.0,
        prompt_tokens=10_000_000,
        new_tokens=6_000_000,
        sample_requests=200,
        sample_tokens=2_000_000,
        sample_ms=100_000.0,
        sample_p50_ms=50_000.0,
        alone_ms=800.0,
    )
    return Load(**{**base, **kw})


def test_lines_over_capacity():
    load = _load()  # offered 24,000 tokens/s to prefill against 20,000: 1.2x; the last waits 250 * 0.2 = 50 s
    assert load.capacity == 20_000.0 and load.ratio == pytest.approx(1.2)
    assert load_lines(load, SimConfig(), "measured h200_sxm") == [
        "load: 1,000 requests over 250 s offer 40,000 prompt tokens/s, 24,000/s to prefill if every shared prefix "
        "hits the cache",
        "capacity: one C=8 group prefills about 20,000 tokens/s (8,192-token chunks, at most 16,384 tokens a step, "
        "measured h200_sxm)",
        "-> offered 1.2x capacity: requests queue for the whole run and TTFT is mostly that wait (the last arrival "
        "waits at least about 50 s); more groups: cpkv sweep, groups = search (docs/sweep.md)",
    ]


@pytest.mark.parametrize(
    ("new_tokens", "tail"),
    [
        (2_500_000, ""),  # 50 %
        (4_500_000, "; near capacity, bursts of arrivals queue and TTFT p99 rises far above p50"),  # 90 %
    ],
)
def test_lines_under_capacity(new_tokens, tail):
    load = _load(new_tokens=new_tokens)
    lines = load_lines(load, SimConfig(), "illustrative constants")
    assert lines[2] == (
        f"-> offered {load.ratio:.0%} of capacity: TTFT is mostly a prompt's own prefill (800 ms for "
        f"one of the mean size, alone) plus waits in bursts{tail}"
    )


def test_lines_of_a_burst():
    load = _load(
        requests=64,
        span_s=0.0,
        sample_requests=64,
        prompt_tokens=331_543,
        new_tokens=331_543,
        sample_tokens=331_543,
        sample_ms=39_700.0,
        sample_p50_ms=31_400.0,
    )
    assert load.ratio is None
    assert load_lines(load, SimConfig(chunk_size=64), "x")[::2] == [
        "load: 64 requests arrive at once: 331,543 prompt tokens, 331,543 to prefill",
        "-> the burst takes about 39.7 s to prefill: TTFT p50 about 31.4 s, the last TTFT about 39.7 s, when the "
        "pool holds it and the policy spreads its pages over the lanes",
    ]


def test_a_burst_prediction_matches_its_replay():
    """tiny-chunks (64 requests at 0 ms): the packing's p50 and last end are the replay's TTFT p50 and max
    under rotation (the pool holds the burst, and rotation spreads it), within 2 %."""
    spec = build_workload("tiny-chunks", seed=0)
    config = SimConfig.for_workload(spec)
    cost = IllustrativeCost(config.cost, config.cp_size)
    load = offered_load(config, spec.requests, cost)
    assert (load.burst, load.sample_requests, load.new_tokens) == (True, 64, load.prompt_tokens)
    result = replay(config, spec, ["rotation"], progress=False, table=False).results[0]
    assert load.sample_p50_ms == pytest.approx(result.metrics["ttft_ms_p50"], rel=0.02)
    assert load.sample_ms == pytest.approx(float(result.ttft_ms.max()), rel=0.02)


def test_offered_load_of_a_rate():
    spec = build_workload("synthetic", num_requests=300, seed=0)
    config = SimConfig.for_workload(spec)
    load = offered_load(config, spec.requests, IllustrativeCost(config.cost, config.cp_size))
    reqs = spec.requests
    assert load.span_s == pytest.approx((reqs[-1].arrival_ms - reqs[0].arrival_ms) / 1000)
    assert load.prompt_tokens == sum(r.input_length for r in reqs)
    assert load.new_tokens == load.prompt_tokens - sum(ideal_hits(reqs, config.page_size))
    assert 0 < load.new_tokens < load.prompt_tokens  # the synthetic prompts share prefixes
    assert load.capacity == pytest.approx(1000 * load.sample_tokens / load.sample_ms)


def test_no_request_is_an_error():
    from cpkv.errors import ConfigError

    with pytest.raises(ConfigError, match="at least one request"):
        offered_load(SimConfig(), [], IllustrativeCost(CostModel(), 8))


def test_prefixes_past_the_cap_are_not_remembered(monkeypatch):
    import cpkv.sim.load as load_mod

    monkeypatch.setattr(load_mod, "MAX_PREFIX_KEYS", 1)
    # only the first prefix, (1,), is remembered: the second prompt hits one block, not two
    assert ideal_hits([_req(0, (1, 2)), _req(1, (1, 2, 3))], 64) == [0, 512]
