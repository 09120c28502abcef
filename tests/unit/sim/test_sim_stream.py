"""Day-scale replay (issue 38): a trace streamed, never held; finished requests kept as compact arrays; the
synthetic Mooncake-like trace of ``bench_simulate.py --scale``."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from cpkv.sim import metrics as metrics_module
from cpkv.sim.config import SimConfig
from cpkv.sim.cost import step_cost
from cpkv.sim.engine import PolicyRun
from cpkv.sim.load import offered_load
from cpkv.sim.metrics import StepRecorder
from cpkv.sim.storage import recompute
from cpkv.sim.synthetic_trace import TICK_MS, synthetic_trace, write_synthetic_trace
from cpkv.sim.trace import TRACE_BLOCK_TOKENS, Request, TraceError, TraceStream, iter_trace, load_trace
from cpkv.sim.workload import DistinctIds, build_workload, workload_stats

pytestmark = pytest.mark.unit

TRACE = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
SMALL = SimConfig(cp_size=4, page_size=16, pages_per_lane=4096, chunk_size=512, max_batch_tokens=1024)


class Lazy:
    """Re-iterable requests that record, at each read after the first, whether the request read before was due
    (its arrival at or before the replay's clock): all True means one request at most is read ahead."""

    def __init__(self, requests):
        self.requests, self.run, self.due, self.reads = tuple(requests), None, [], 0

    def __len__(self):
        return len(self.requests)

    def __iter__(self):
        previous = None
        for r in self.requests:
            if previous is not None:
                self.due.append(previous.arrival_ms <= self.run.now_ms)
            self.reads += 1
            previous = r
            yield r


def _metrics(result):
    return {k: v for k, v in result.metrics.items() if k != "sim_wall_s"}


@pytest.mark.parametrize(
    ("name", "count", "policy"),
    [
        ("synthetic", 60, "balanced"),
        ("tiny-chunks", None, "legacy"),
        ("short-prompts", 40, "rotation"),
        ("tiny-chunks-reload", 30, "balanced"),
    ],
)
def test_streamed_replay_equals_list_replay(name, count, policy):
    spec = build_workload(name, num_requests=count, seed=1)
    config = SimConfig.for_workload(spec)
    listed = PolicyRun(config, policy, spec.requests).run()
    lazy = Lazy(spec.requests)
    run = PolicyRun(config, policy, lazy)
    lazy.run = run
    streamed = run.run()
    assert _metrics(streamed) == _metrics(listed)
    assert np.array_equal(streamed.used, listed.used) and np.array_equal(streamed.times_ms, listed.times_ms)
    assert np.array_equal(streamed.ttft_ms, listed.ttft_ms)
    # read as arrivals come due: every request read once, each read after the one before it was due
    assert lazy.reads == len(spec.requests) and len(lazy.due) == lazy.reads - 1 and all(lazy.due)


@pytest.mark.skipif(not TRACE.exists(), reason=f"needs the shared trace {TRACE}")
def test_trace_stream_replay_equals_loaded_trace():
    stream = build_workload("trace", num_requests=150, trace_path=TRACE).requests
    assert isinstance(stream, TraceStream) and len(stream) == 150
    listed = tuple(load_trace(TRACE, max_requests=150))
    assert tuple(stream) == listed and tuple(stream) == listed  # each pass re-reads the file
    assert stream[7] == listed[7] and stream[-1] == listed[-1] and stream[3:5] == listed[3:5]
    config = SimConfig(cp_size=8, page_size=64, pages_per_lane=2048)
    assert _metrics(PolicyRun(config, "balanced", stream).run()) == _metrics(
        PolicyRun(config, "balanced", listed).run()
    )
    assert workload_stats(stream) == _reference_stats(listed)
    cost = step_cost(config)
    assert offered_load(config, stream, cost) == offered_load(config, list(listed), cost)


def _reference_stats(requests):
    """workload_stats as it was before streaming: numpy over whole arrays."""
    prompt = np.array([r.input_length for r in requests], dtype=np.int64)
    output = np.array([r.output_length for r in requests], dtype=np.int64)
    arrival = np.array([r.arrival_ms for r in requests], dtype=np.float64)
    blocks = np.fromiter(itertools.chain.from_iterable(r.hash_ids for r in requests), dtype=np.int64)
    return {
        "num_requests": len(requests),
        "prompt_tokens_total": int(prompt.sum()),
        "prompt_tokens_mean": float(prompt.mean()),
        "prompt_tokens_max": int(prompt.max()),
        "output_tokens_mean": float(output.mean()),
        "duration_ms": float(arrival.max() - arrival.min()),
        "repeated_block_share": (blocks.size - np.unique(blocks).size) / blocks.size,
    }


@pytest.mark.parametrize("name", ["synthetic", "tiny-chunks", "short-prompts", "tiny-chunks-reload"])
def test_streamed_stats_equal_the_array_stats(name):
    requests = build_workload(name, seed=2).requests
    assert workload_stats(iter(requests)) == _reference_stats(requests)


def test_distinct_ids_exact_in_any_order():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5000, 20_000)
    counter = DistinctIds()
    for chunk in np.array_split(ids, 7):
        counter.add(chunk)
    assert (counter.seen, counter.distinct) == (20_000, np.unique(ids).size)
    dense = DistinctIds()  # numbered in order of first appearance: nothing kept beyond the dense bound
    dense.add(np.array([0, 1, 1, 2, 0, 4]))
    dense.add(np.array([3, 5, 2]))
    assert (dense.seen, dense.distinct, dense.dense, dense.sparse.size) == (9, 6, 6, 0)


def test_iter_trace_is_lazy_and_keeps_load_trace_errors(tmp_path):
    line = {"input_length": 1000, "output_length": 5, "hash_ids": [3, 4]}
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps({"timestamp": 0, **line}) + "\n" + json.dumps({"timestamp": 1, **line}) + "\nnot json\n"
    )
    it = iter_trace(path)
    assert [r.req_id for r in itertools.islice(it, 2)] == [0, 1]  # yielded before the bad line is read
    with pytest.raises(TraceError, match=r"t.jsonl:3: invalid JSON"):
        next(it)
    with pytest.raises(TraceError, match=r"t.jsonl:3: invalid JSON"):
        TraceStream(path)  # built by a validating pass: fails before any replay
    # a blank line between requests is refused even past max_requests (as load_trace); trailing ones are not
    path.write_text(
        json.dumps({"timestamp": 0, **line}) + "\n\n" + json.dumps({"timestamp": 1, **line}) + "\n"
    )
    for cap in (2, 3, None):
        with pytest.raises(TraceError, match=r"t.jsonl:2: blank line"):
            load_trace(path, cap)
    assert len(load_trace(path, 1)) == 1  # the blank line is past the cap
    path.write_text(json.dumps({"timestamp": 0, **line}) + "\n\n  \n")
    assert len(TraceStream(path)) == 1 == len(load_trace(path))
    path.write_text("\n\n")
    with pytest.raises(TraceError, match=r"t.jsonl:1: empty trace"):
        TraceStream(path)


def test_synthetic_trace_is_seeded_and_mooncake_shaped(tmp_path):
    t = synthetic_trace(1000, 0)
    again = synthetic_trace(1000, 0)
    for a, b in zip(vars(t).values(), vars(again).values(), strict=True):
        assert np.array_equal(a, b)
    assert not np.array_equal(synthetic_trace(1000, 1).input_length, t.input_length)
    blocks = np.diff(t.block_offsets)
    assert np.array_equal(blocks, -(-t.input_length // TRACE_BLOCK_TOKENS))
    assert (t.timestamp_ms[0], bool((np.diff(t.timestamp_ms) >= 0).all())) == (0, True)
    assert not (t.timestamp_ms % TICK_MS).any()
    firsts = t.block_ids[t.block_offsets[:-1]]
    assert not firsts.any()  # every prompt opens with block 0, the shared system prompt
    _, first_seen = np.unique(t.block_ids, return_index=True)
    assert np.array_equal(np.sort(first_seen), first_seen)  # ids dense in order of first appearance
    # exact figures of seed 0 (numpy's PCG64 stream): tokens, output tokens, span, block occurrences, distinct
    assert (
        int(t.input_length.sum()),
        int(t.output_length.sum()),
        int(t.timestamp_ms[-1]),
        int(t.block_ids.size),
        int(np.unique(t.block_ids).size),
    ) == (9_877_973, 343_674, 282_000, 19_832, 14_929)
    path = write_synthetic_trace(tmp_path / "s.jsonl", 1000, 0)
    loaded = load_trace(path)
    assert [r.input_length for r in loaded] == t.input_length.tolist()
    assert [r.arrival_ms for r in loaded] == t.timestamp_ms.astype(float).tolist()
    assert loaded[5].hash_ids == tuple(t.block_ids[t.block_offsets[5] : t.block_offsets[6]].tolist())


def test_step_recorder_blocks_equal_stacked_rows(monkeypatch):
    monkeypatch.setattr(metrics_module, "STEP_BLOCK", 3)
    rec = StepRecorder(2)
    rows = [
        (float(i), np.array([i, 2 * i]), None if i % 3 == 0 else np.array([i / 2, 1.0])) for i in range(10)
    ]
    for t, used, work in rows:
        rec.record(t, used, work)
    assert rec.num_steps == 10
    assert np.array_equal(rec.used(), np.stack([u for _, u, _ in rows]).astype(np.int32))
    assert rec.used().dtype == np.int32 and rec.times().tolist() == [t for t, _, _ in rows]
    work = np.stack([w for _, _, w in rows if w is not None])  # [prefill steps, C]
    peak, mean = rec.work()
    assert peak.tolist() == work.max(axis=1).tolist() and mean.tolist() == work.mean(axis=1).tolist()
    empty = StepRecorder(2)
    assert empty.used().shape == (0, 2) and [a.shape for a in empty.work()] == [(0,), (0,)]


def test_recompute_memory_is_two_generations(monkeypatch):
    monkeypatch.setattr(recompute, "MAX_COMPUTED_KEYS", 4)
    counter = recompute.RecomputeCounter(page_size=2, block_size=2)
    # 7 tokens in blocks of 2: 4 block ids, 3 whole pages handed over (6 tokens) -> 3 block prefixes each
    prompts = [Request(k, 0.0, 7, 0, tuple(range(10 * k, 10 * k + 4))) for k in range(4)]
    for p in prompts:
        counter.admitted(p, 0)
        counter.retired(p, 6)
    # a generation fills at 4 prefixes: prompts 0-1 (6 prefixes) become the older generation, then prompts 2-3
    # fill the next and push them out: the last two prompts' prefixes are kept, the first ones forgotten
    again = [Request(10 + k, 0.0, 7, 0, p.hash_ids) for k, p in enumerate(prompts)]
    assert counter.admitted(again[3], 0) == 6 and counter.admitted(again[0], 0) == 0
