"""The memory a day-scale replay's report takes (issue 38: 2,000,000 requests within 1.2x the peak RSS of
1,000,000): the step recorder keeps a prefill step's work as two floats and hands its used pages over
without a second copy, the lane metrics and the plot's curve make their float arrays a block of steps at a
time, with the same bits as over all steps at once, and the replay's state is freed before the report is
written."""

import gc
import tracemalloc

import numpy as np
import pytest

import cpkv.sim.replay as replay_mod
from cpkv.sim import metrics as metrics_module
from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.lanes_plot import imbalance_curve
from cpkv.sim.metrics import BUSY_FRACTION, StepRecorder, lane_metrics, step_work
from cpkv.sim.replay import replay
from cpkv.sim.workload import build_workload

pytestmark = pytest.mark.unit


def _lane_metrics_at_once(used: np.ndarray, caps) -> dict:
    """``lane_metrics`` as written before its blocks: every step's fills in one float64 array."""
    caps = np.broadcast_to(np.asarray(caps, dtype=np.float64), (used.shape[1],))
    fill = used.astype(np.float64) / caps
    mean = fill.mean(axis=1)
    busy = mean >= BUSY_FRACTION
    steps = busy if busy.any() else mean > 0
    ratio = fill[steps].max(axis=1) / mean[steps]
    return {
        "lane_pages_peak": used.max(axis=0).astype(np.int64).tolist(),
        "lane_imbalance_peak": float(ratio.max()) if ratio.size else 1.0,
        "lane_imbalance_mean": float(ratio.mean()) if busy.any() else None,
    }


def _curve_at_once(used: np.ndarray, caps, busy_fraction: float) -> np.ndarray:
    """``imbalance_curve`` as written before its blocks."""
    used = np.asarray(used, dtype=np.float64)
    caps = np.broadcast_to(np.asarray(caps, dtype=np.float64), (used.shape[1],))
    fill = used / caps if caps.all() else used
    mean = fill.mean(axis=1)
    busy = (mean >= (busy_fraction if caps.all() else 0.0)) & (mean > 0)
    out = np.full(used.shape[0], np.nan)
    out[busy] = fill[busy].max(axis=1) / mean[busy]
    return out


@pytest.mark.parametrize("caps", [1000, [900, 1000, 1000, 1100, 1000, 1000, 1000, 1000]])
@pytest.mark.parametrize("top", [1000, 90])  # 90: no step is busy (every fill under 0.1)
def test_lane_metrics_and_curve_by_blocks_have_the_bits_of_all_steps_at_once(monkeypatch, caps, top):
    monkeypatch.setattr(metrics_module, "STEP_BLOCK", 7)
    used = np.random.default_rng(3).integers(0, top, size=(100, 8)).astype(np.int32)
    used[5] = 0  # a step with no page in use
    assert lane_metrics(used, caps) == _lane_metrics_at_once(used, caps)
    assert (lane_metrics(used, caps)["lane_imbalance_mean"] is None) == (top == 90)
    for fraction in (BUSY_FRACTION, 0.0):
        want = _curve_at_once(used, caps, fraction)
        got = imbalance_curve(used, caps, busy_fraction=fraction)
        assert np.array_equal(got, want, equal_nan=True) and np.isnan(got[5])


def test_lane_metrics_allocates_less_than_the_steps_it_reads():
    used = np.random.default_rng(0).integers(100, 1000, size=(200_000, 8)).astype(np.int32)  # 6.4 MB
    tracemalloc.start()
    try:
        lane_metrics(used, 1000)
        imbalance_curve(used, 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # every step busy: the ratios (8 B a step) and their join, plus a block's fills; all at once the fills
    # alone were 64 B a step, twice (16 times used.nbytes)
    assert peak < used.nbytes, (peak, used.nbytes)


def test_the_recorder_keeps_two_floats_of_work_a_prefill_step_with_the_bits_of_step_work(monkeypatch):
    monkeypatch.setattr(metrics_module, "STEP_BLOCK", 4)
    rng = np.random.default_rng(1)
    rec = StepRecorder(8)
    work = rng.random((23, 8)) * rng.integers(1, 1000, size=(23, 1))  # [prefill steps, C] ms
    for w in work:
        rec.record(1.0, np.zeros(8, np.int32), w)
    kept = sum(a.nbytes for a in (*rec._work_max, *rec._work_mean))
    assert kept == 2 * 8 * 20  # 5 blocks of 4 reduced; 3 steps still in the block being filled
    peak, mean = rec.work()
    want = step_work(work)
    assert np.array_equal(peak, want[0]) and np.array_equal(mean, want[1])
    assert np.array_equal(peak, work.max(axis=1)) and np.array_equal(mean, work.mean(axis=1))
    again = rec.work()
    assert again[0] is peak and again[1] is mean  # joined once
    rec.record(2.0, np.zeros(8, np.int32), np.full(8, 5.0))
    assert rec.work()[0].tolist() == [*peak.tolist(), 5.0] and rec.work()[1][-1] == 5.0


def test_used_is_joined_once_and_the_recorder_goes_on(monkeypatch):
    monkeypatch.setattr(metrics_module, "STEP_BLOCK", 3)
    rec = StepRecorder(2)
    rows = [np.array([i, 10 * i]) for i in range(7)]
    for i, row in enumerate(rows[:5]):
        rec.record(float(i), row, None)
    first = rec.used()
    assert first.tolist() == [r.tolist() for r in rows[:5]] and rec.used() is first  # no second copy
    assert len(rec._used.full) == 1 and rec._used.n == 0  # the blocks were replaced by the joined array
    for i, row in enumerate(rows[5:], 5):
        rec.record(float(i), row, None)
    assert rec.used().tolist() == [r.tolist() for r in rows] and first.tolist() == rec.used()[:5].tolist()
    assert rec.used().dtype == np.int32 and rec.times().tolist() == [float(i) for i in range(7)]


def test_the_replay_state_is_freed_before_the_report_is_written(tmp_path, monkeypatch):
    spec = build_workload("synthetic", num_requests=12)
    alive = []

    def write_outputs(out_dir, config, results, **kw):
        alive.append(sum(isinstance(o, PolicyRun) for o in gc.get_objects()))
        return []

    monkeypatch.setattr(replay_mod, "write_outputs", write_outputs)
    cfg = SimConfig(cp_size=4, page_size=16, pages_per_lane=1024)
    result = replay(cfg, spec, ["rotation", "balanced"], out_dir=tmp_path, progress=False, table=False)
    assert [r.policy for r in result.results] == ["rotation", "balanced"]
    assert alive == [0, 0]  # after each policy: no PolicyRun (its cache, recompute record) outlives it
