"""The measured cost model (cpkv.cost.MeasuredCost, SPEC C-COST) on aiconfigurator's H200 / DeepSeek-V3.2 /
SGLang tables: its composition against a plan-independent reference, aiconfigurator's own prediction at
C=1, the measured rows it reads, monotone work, decode, provenance and errors."""

import importlib.resources
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv.config import CPConfig
from cpkv.cost import CostModelError, MeasuredSpec
from cpkv.planner import plan_batch

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-COST")]


def _prefill_reference(cost, prefix_lens, extend_lens, C, P, heads=None, strategy="zigzag"):
    """Per-rank work from docs/cost-model.md's formulas, runs from the per-token oracle (not the planner)."""
    t = cost.tables
    F = float(t.attention(1, 0))
    batch = oracle.plan_batch(list(prefix_lens), list(extend_lens), C, P, heads, strategy=strategy)
    n = batch["per_rank_tokens"]
    att = [F * (k > 0) for k in n]  # the module's fixed cost once per rank that computes
    for req, L0 in zip(batch["requests"], prefix_lens, strict=True):
        for r in range(C):
            mine = [L0 + i for i, owner in enumerate(req["token_owner"]) if owner == r]
            for a, b in oracle._runs(mine):
                att[r] += float(t.attention(b - a, a)) - F
    T, B, M = sum(extend_lens), sum(1 for e in extend_lens if e), max(n)
    linear = t.per_token(np.array(n)) + t.group(T) + t.logits(B)
    comm = t.dispatch(C * M) + cost.comm.allgather_ms(M * t.hidden_size * 2, C)
    return linear + np.array(att) + comm


@st.composite
def batches(draw, max_requests=3):
    C = draw(st.sampled_from([1, 2, 4, 8]))
    P = draw(st.sampled_from([1, 16, 64]))
    B = draw(st.integers(1, max_requests))
    prefix = [draw(st.integers(0, 40_000)) for _ in range(B)]
    extend = [draw(st.integers(0, 20_000)) for _ in range(B)]
    heads = [
        draw(st.integers(0, C - 1)) if L0 % P and E else None for L0, E in zip(prefix, extend, strict=True)
    ]
    return C, P, prefix, extend, heads


@pytest.mark.slow
def test_one_rank_matches_aiconfigurators_own_prefill_prediction(measured):
    # The acceptance line: at C=1 the composed step is within 10 % of predict_prefill_latency (isl counts
    # the prefix). benchmarks/bench_costs.py prints the figures.
    from aiconfigurator_core.sdk.engine import EngineHandle

    ref = EngineHandle.compile("deepseek-ai/DeepSeek-V3.2", "h200_sxm", "sglang")
    cost = measured(1)
    for isl in (1024, 4096, 8192, 32768):
        for prefix in (0, isl // 2):
            ours = cost.step_work(plan_batch([prefix], [isl - prefix], CPConfig(1, 64, "rotation")))[0]
            assert ours == pytest.approx(ref.predict_prefill_latency(1, isl, prefix), rel=0.10), (isl, prefix)


@pytest.mark.clause("C-INTERLEAVE")
@settings(max_examples=25, deadline=None)
@given(batches())
def test_interleave_prices_each_ranks_many_runs_as_they_are(measured, batch):
    # Under interleave a rank computes about m / C runs of P tokens (zigzag: at most two per request):
    # each run is priced at its own queries and keys, the module's fixed cost once per rank.
    C, P, prefix, extend, heads = batch
    cost = measured(C)
    config = CPConfig(C, P, "rotation", "interleave")
    plan = plan_batch(prefix, extend, config, head_owners=[-1 if h is None else h for h in heads])
    work = cost.step_work(plan)
    if not sum(extend):
        assert np.array_equal(work, np.zeros(C))
        return
    assert np.allclose(work, _prefill_reference(cost, prefix, extend, C, P, heads, "interleave"), rtol=1e-9)
    parts = cost.breakdown(plan)
    assert np.allclose(sum(parts.values()), work, rtol=1e-12)


@pytest.mark.clause("C-GATHER")  # the gather-back buffer is C * M rows
@settings(max_examples=40, deadline=None)
@given(batches())
def test_step_work_is_the_documented_composition_of_each_ranks_runs(measured, batch):
    C, P, prefix, extend, heads = batch
    cost = measured(C)
    plan = plan_batch(
        prefix, extend, CPConfig(C, P, "rotation"), head_owners=[-1 if h is None else h for h in heads]
    )
    work = cost.step_work(plan)
    if not sum(extend):
        assert np.array_equal(work, np.zeros(C))
        return
    assert np.allclose(work, _prefill_reference(cost, prefix, extend, C, P, heads), rtol=1e-9)
    parts = cost.breakdown(plan)
    assert np.allclose(sum(parts.values()), work, rtol=1e-12)
    assert all(np.all(v >= 0) for v in parts.values())


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([16, 64]),
    st.integers(0, 600),
    st.integers(1, 30_000),
    st.integers(1, 400),
    st.integers(0, 7),
)
def test_work_is_monotone_in_causal_pairs(measured, C, P, pages, E, shift, phase):
    # The same owners (same phase) with the request shifted later by whole pages: every rank computes the
    # same tokens over more keys, so no rank may get less time.
    cost, cfg = measured(C), CPConfig(C, P, "rotation")
    early = cost.step_work(plan_batch([pages * P], [E], cfg, phases=[phase % C]))
    late = cost.step_work(plan_batch([(pages + shift) * P], [E], cfg, phases=[phase % C]))
    assert np.all(late >= early - 1e-9)


@settings(max_examples=40, deadline=None)
@given(batches(max_requests=2), st.integers(0, 50_000), st.integers(1, 20_000))
def test_work_is_monotone_in_tokens(measured, batch, L0, E):
    # One more request in the step (its plan leaves the others' unchanged, C-BATCH): more tokens, runs,
    # rows to gather; no rank may get less time.
    C, P, prefix, extend, heads = batch
    cost, cfg = measured(C), CPConfig(C, P, "rotation")
    heads = [-1 if h is None else h for h in heads]
    L0 -= L0 % P
    before = cost.step_work(plan_batch(prefix, extend, cfg, head_owners=heads))
    after = cost.step_work(plan_batch([*prefix, L0], [*extend, E], cfg, head_owners=[*heads, -1]))
    assert np.all(after >= before - 1e-9)


def test_decode_steps_use_the_generation_tables(measured):
    C, P = 4, 64
    cost, cfg = measured(C), CPConfig(C, P, "rotation")
    t = cost.tables
    seq = [1000, 5000, 20000, 3000, 7000, 64000]
    decode = plan_batch(seq, [1] * len(seq), cfg, head_owners=[(s // P) % C if s % P else -1 for s in seq])
    owner = decode.token_owner
    d = np.bincount(owner, minlength=C)
    mean_len = np.array(
        [np.mean([s + 1 for s, o in zip(seq, owner, strict=True) if o == r] or [0]) for r in range(C)]
    )
    D = len(seq)
    ref = (
        np.where(d > 0, t.gen_attention(d, mean_len), 0.0)
        + t.gen_per_token(d)
        + t.gen_group(D)
        + t.gen_logits(D)
        + cost.comm.allgather_ms(d.max() * t.hidden_size * 2, C)
    )
    assert np.allclose(cost.step_work(None, decode), ref, rtol=1e-9)
    longer = plan_batch(
        [s + 10 * C * P for s in seq],
        [1] * len(seq),
        cfg,
        phases=decode.request_phases,
        head_owners=decode.head_owners,
    )
    assert np.all(cost.step_work(None, longer) >= cost.step_work(None, decode))
    # a mixed step runs the token-parallel parts, the MoE and its communication once, over both
    prefill = plan_batch([0], [4096], cfg)
    n = prefill.per_rank_tokens + d
    mixed = (
        cost.breakdown(prefill)["attention"]
        + cost.breakdown(prefill)["indexer"]
        + np.where(d > 0, t.gen_attention(d, mean_len), 0.0)
        + t.per_token(n)
        + t.group(4096 + D)
        + t.logits(1 + D)
        + t.dispatch(C * n.max())
        + cost.comm.allgather_ms(n.max() * t.hidden_size * 2, C)
    )
    assert np.allclose(cost.step_work(prefill, decode), mixed, rtol=1e-9)
    assert np.array_equal(cost.step_work(None, None), np.zeros(C))


def test_indexer_share_and_the_dense_short_path(measured):
    cost = measured(8)
    short = cost.breakdown(plan_batch([0], [1024], CPConfig(8, 64, "rotation")))
    assert np.array_equal(
        short["indexer"], np.zeros(8)
    )  # every key within top-k: dense attention, no indexer
    long = cost.breakdown(plan_batch([65536], [32768], CPConfig(8, 64, "rotation")))
    assert np.all(long["indexer"] > 0) and np.all(long["attention"] > 0)
    assert np.all(long["comm"] == long["comm"][0]) and np.all(long["linear"] == long["linear"][0])


def _table(kind: str, name: str):
    import pandas as pd

    root = importlib.resources.files("aiconfigurator_core") / "systems" / "data" / "h200_sxm"
    return pd.read_parquet(str(root / kind / name))


def test_prices_are_the_measured_rows(measured):
    # Independent of aiconfigurator's engine: its parquet rows, read with pandas. DSA context module of
    # DeepSeek-V3.2 at 8,192 queries after 65,536 keys (fp8 KV, one GPU), per layer, times 61 layers ...
    cost = measured(8)
    dsa = _table("sparse_attention", "sglang/0.5.14/dsa_context_module_perf.parquet")
    row = dsa[
        (dsa.model == "deepseek-ai/DeepSeek-V3.2")
        & (dsa.op_name == "dsa_context_module")
        & (dsa.tp_size == 1)
        & (dsa.kv_cache_dtype == "fp8")
        & (dsa.batch_size == 1)
        & (dsa.isl == 8192)
        & (dsa.step == 65536)
    ]
    assert len(row) == 1 and cost.tables.num_layers == 61
    assert float(cost.tables.attention(8192, 65536)) == pytest.approx(61 * row.latency.iloc[0], rel=0.01)
    # ... and NCCL 2.26.2's all-gather of 2**27 half elements over 8 GPUs (8 ranks of 2**25 bytes).
    nccl = _table("comm", "nccl/2.26.2/nccl_perf.parquet")
    ag = nccl[
        (nccl.op_name == "all_gather")
        & (nccl.nccl_dtype == "half")
        & (nccl.num_gpus == 8)
        & (nccl.message_size == 2**27)
    ]
    assert cost.comm.allgather_ms(2**25, 8) == pytest.approx(ag.latency.iloc[0], rel=1e-6)


def test_provenance_names_what_priced_the_step(measured):
    p = measured(4).provenance()
    assert {
        k: p[k]
        for k in (
            "cost_model",
            "gpu",
            "model",
            "backend",
            "backend_version",
            "nccl_version",
            "aiconfigurator_version",
            "cp_size",
            "ep_size",
            "moe_tp_size",
        )
    } == {
        "cost_model": "measured",
        "gpu": "h200_sxm",
        "model": "deepseek-ai/DeepSeek-V3.2",
        "backend": "sglang",
        "backend_version": "0.5.14",
        "nccl_version": "2.26.2",
        "aiconfigurator_version": "0.12.0",
        "cp_size": 4,
        "ep_size": 4,
        "moe_tp_size": 1,
    }
    assert p["tables_sha256"] != measured(2).provenance()["tables_sha256"]
    assert measured(4, ep_size=2).provenance()["moe_tp_size"] == 2


def test_kv_allgather_prices_every_layers_kv_rows(measured):
    cost = measured(8)
    assert cost.tables.kv_row_bytes == 576 * 2 + 128 + 4  # latent bf16, fp8 index key and its fp32 scale
    # gathered as SGLang moves them (aiconfigurator's CONTEXT_PARALLEL_DSA_MODELING.md 3.4): latent and index key bf16
    assert cost.tables.kv_gather_row_bytes == (576 + 128) * 2 == 1408
    assert cost.kv_allgather_ms(1024) == pytest.approx(61 * cost.comm.allgather_ms(1024 * 1408, 8))
    assert measured(1).kv_allgather_ms(1024) == 0.0


@pytest.mark.parametrize(
    ("spec", "cp_size", "message"),
    [
        ({"gpu": "h900"}, 2, "h900"),
        ({"model": "Qwen/Qwen3-32B"}, 2, "DeepSeek sparse-attention"),
        ({"ep_size": 3}, 8, "ep_size 3 must divide cp_size 8"),
        ({}, 3, "at cp_size 3, ep_size 3: .*MoE data missing"),
    ],
)
def test_what_cannot_be_priced_is_one_typed_error(aic, spec, cp_size, message):
    from cpkv.cost import MeasuredCost

    with pytest.raises(CostModelError, match=message):
        MeasuredCost.load(MeasuredSpec(**spec), cp_size)


def test_every_group_shares_the_one_gpu_tables_and_prices_its_own_moe(measured):
    four, eight = measured(4).tables, measured(8).tables
    for name in ("attention", "per_token", "logits", "gen_attention", "gen_per_token", "gen_logits", "comm"):
        assert getattr(four, name) is getattr(eight, name), name  # sampled once per process
    assert measured(4, ep_size=2).tables.attention is four.attention  # one GPU: no expert parallelism
    assert not np.array_equal(four.group.y, eight.group.y)  # the MoE over 4 and over 8 GPUs


def test_tables_travel_to_a_fresh_interpreter_and_price_the_same_there(measured, tmp_path):
    """What a sweep ships to its workers (its plan's tables -> ``aic.install_tables``): the pickled tables
    price a step and the group's all-gather exactly as here without importing aiconfigurator; any other
    collective (reduce-scatter over 2 GPUs) prices the same there, sampled on first use if no test here
    sampled it before."""
    import pickle

    cost = measured(4)
    plan = plan_batch([1024, 0], [5000, 300], CPConfig(4, 64, "balanced"))
    here = [cost.step_work(plan).tolist(), cost.comm.allgather_ms(2**20, 4)]
    (tmp_path / "tables.pkl").write_bytes(pickle.dumps({(MeasuredSpec(), 4): cost.tables}))
    child = f"""
import json, pickle, sys
from cpkv.config import CPConfig
from cpkv.cost import MeasuredCost, MeasuredSpec
from cpkv.cost.aic import install_tables
from cpkv.planner import plan_batch
install_tables(pickle.loads(open({str(tmp_path / "tables.pkl")!r}, "rb").read()))
cost = MeasuredCost.load(MeasuredSpec(), 4)
plan = plan_batch([1024, 0], [5000, 300], CPConfig(4, 64, "balanced"))
out = [cost.step_work(plan).tolist(), cost.comm.allgather_ms(2**20, 4), "aiconfigurator_core" in sys.modules]
out.append(cost.comm.reduce_scatter_ms(2**20, 2))
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    work, allgather, imported, reduce_scatter = json.loads(proc.stdout)
    assert [work, allgather] == here and imported is False
    assert reduce_scatter == cost.comm.reduce_scatter_ms(2**20, 2) > 0
