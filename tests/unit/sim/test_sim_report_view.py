"""The side-by-side table and lanes.png of `cpkv simulate`: one precision per metric, full metric
names, readable lane peaks; a titled figure with labelled lines, the legend outside the data, 4 decimals."""

import re

import numpy as np
import pytest

from cpkv.sim.lanes_plot import binned, imbalance_curve, lanes_figure, lanes_png
from cpkv.sim.report import REPORT_FIELDS, PolicyResult, format_value, print_table

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("sim_wall_s", 14.9, "14.90"),
        ("sim_wall_s", 9.402, "9.40"),
        ("sim_wall_s", 0.921, "0.92"),
        ("sim_wall_s", 1234.5, "1,234.50"),
        ("lane_imbalance_peak", 1.00976, "1.0098"),
        ("lane_imbalance_mean", 8.0, "8.0000"),
        ("compute_imbalance_mean", 12.34567, "12.3457"),
        ("ttft_ms_p50", 4148.94, "4,148.9"),
        ("ttft_ms_p99", 3.25, "3.2"),
        ("ttft_ms_p99", None, "-"),
        ("owner_lane_exhausted", 4114, "4,114"),
        ("livelock_detected", True, "yes"),
        ("livelock_detected", False, "no"),
        ("lane_pages_peak", [638, 644, 645, 646, 648, 644, 645, 640], "638 644 645 646\n648 644 645 640"),
        ("lane_pages_peak", [814, 0, 0, 0, 0, 0, 0, 0], "814   0   0   0\n  0   0   0   0"),
    ],
)
def test_one_precision_per_metric(key, value, text):
    assert format_value(key, value) == text


def _result(policy, used, times_ms=None, **metrics):
    used = np.asarray(used, dtype=np.int32)
    base = {k: 0 for k in REPORT_FIELDS}
    base.update(
        lane_pages_peak=used.max(axis=0).tolist(),
        lane_imbalance_peak=1.0,
        lane_imbalance_mean=1.0,
        livelock_detected=False,
        ttft_ms_p50=None,
        ttft_ms_p99=None,
    )
    base.update(metrics)
    times = np.arange(1, used.shape[0] + 1, dtype=np.float64) * 100.0 if times_ms is None else times_ms
    return PolicyResult(policy, base, times, used)


def _three_policies_c8():
    return [
        _result(
            "rotation",
            [[638, 644, 645, 646, 648, 644, 645, 640]],
            sim_wall_s=14.9,
            lane_imbalance_peak=1.00976,
        ),
        _result("legacy", [[16384, 0, 0, 0, 0, 0, 0, 0]], sim_wall_s=10.2, lane_imbalance_peak=8.0),
        _result("balanced", [[16383, 16384, 16384, 16384, 16384, 16384, 16384, 16384]], sim_wall_s=0.921),
    ]


@pytest.mark.parametrize("width", [80, 100, 140])
def test_table_keeps_metric_names_and_lane_peaks_whole(width, capsys):
    results = _three_policies_c8()
    print_table(results, "t", width=width)
    out = capsys.readouterr().out
    assert "…" not in out
    lines = out.splitlines()
    assert max(map(len, lines)) <= width
    for key in REPORT_FIELDS:
        assert any(line.split()[:1] == [key] for line in lines), key
    walls = next(line for line in lines if line.split()[:1] == ["sim_wall_s"]).split()[1:]
    assert walls == ["14.90", "10.20", "0.92"]
    # lane_pages_peak: every lane value of every policy, in lane order, whole numbers of equal width
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["lane_pages_peak"])
    end = next(i for i, line in enumerate(lines) if line.split()[:1] == ["lane_imbalance_peak"])
    cells = [re.findall(r"[\d,]+", line[38:]) for line in lines[start:end]]
    per_line = len(cells[0]) // 3
    for k, r in enumerate(results):
        values = [int(v.replace(",", "")) for row in cells for v in row[k * per_line : (k + 1) * per_line]]
        assert values == r.metrics["lane_pages_peak"]


def test_imbalance_curve_and_bins_by_hand():
    used = np.array([[1, 0], [4, 2], [3, 3], [0, 0]])
    curve = imbalance_curve(used, pages_per_lane=10)  # counted: mean >= 1.0
    assert np.isnan(curve[0]) and curve[1] == pytest.approx(4 / 3) and curve[2] == 1.0 and np.isnan(curve[3])
    t, lo, hi = binned(np.array([1.0, 2, 3, 4]), np.array([1.0, np.nan, 3, 2]), bins=2)
    assert t.tolist() == [2.0, 4.0] and lo.tolist() == [1.0, 2.0] and hi.tolist() == [1.0, 3.0]
    # 5 steps in 2 bins of 3 (the last one padded): an all-NaN bin stays a gap
    t, lo, hi = binned(np.array([1.0, 2, 3, 4, 5]), np.array([np.nan, np.nan, np.nan, 2, 7]), bins=2)
    assert t.tolist() == [3.0, 5.0] and np.isnan(lo[0]) and np.isnan(hi[0]) and (lo[1], hi[1]) == (2.0, 7.0)


CONFIG = {
    "workload_description": "tiny chunks, seed 0",
    "cp_size": 4,
    "page_size": 64,
    "pages_per_lane": 815,
    "policies": ["rotation", "legacy", "balanced"],
    "workload_stats": {"num_requests": 64},
}


def _figure_results():
    steps = 50
    even = np.tile([100, 101, 100, 99], (steps, 1)) + np.arange(steps)[:, None] * 10
    lane0 = np.zeros((steps, 4), dtype=np.int64)
    lane0[:, 0] = 100 + np.arange(steps) * 14
    livelock = {"lane": 0}
    return [
        _result("rotation", even, lane_imbalance_peak=1.00976, lane_imbalance_mean=1.0050),
        _result(
            "legacy",
            lane0,
            lane_imbalance_peak=8.0,
            lane_imbalance_mean=4.0,
            livelock_detected=True,
            livelock=livelock,
        ),
    ]


def test_figure_title_labels_precision_and_legend_outside():
    fig = lanes_figure(_figure_results(), CONFIG, "interrupted")
    fig.canvas.draw()
    title = fig._suptitle.get_text()
    assert "tiny chunks, seed 0" in title and "C=4" in title and "P=64" in title and "Q=815" in title
    assert "64 requests" in title and "interrupted: balanced not run" in title
    texts = [t.get_text() for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)]
    assert "rotation:  lane_imbalance_peak 1.0098   lane_imbalance_mean 1.0050" in texts
    assert "LIVELOCK (lane 0 full)" in texts
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert "capacity Q = 815 pages per lane" in labels
    assert any(label.startswith("max_r used / mean_r used") for label in labels)
    assert any(label.startswith("lane_imbalance_mean") for label in labels)
    assert any(label.startswith("lane_pages_peak") for label in labels)
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in fig.axes)  # outside the data


def test_figure_curve_is_max_over_mean_of_counted_steps():
    results = _figure_results()
    fig = lanes_figure(results, CONFIG)
    rotation_axes = fig.axes[0]
    (curve,) = [line for line in rotation_axes.get_lines() if line.get_label().startswith("max_r used")]
    used = results[0].used.astype(float)
    expected = used.max(axis=1) / used.mean(axis=1)
    counted = used.mean(axis=1) >= 81.5
    assert np.allclose(curve.get_ydata()[counted], expected[counted])
    assert np.isnan(curve.get_ydata()[~counted]).all()
    bars = [p.get_height() for p in fig.axes[1].patches]
    assert bars == results[0].metrics["lane_pages_peak"]


def test_png_bytes():
    assert lanes_png(_figure_results(), CONFIG)[:8] == b"\x89PNG\r\n\x1a\n"


def test_binned_panels_of_different_lengths_share_one_band_legend_entry():
    # Long runs are binned, and two policies' runs have different step counts (so different bin counts):
    # the legend names the band once, not once per panel.
    rng = np.random.default_rng(3)
    results = [
        _result(p, rng.integers(400, 815, size=(n, 4))) for p, n in (("rotation", 4000), ("balanced", 3100))
    ]
    fig = lanes_figure(results, CONFIG)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert [label for label in labels if label.startswith("min-max")] == [
        "min-max of the steps in each time bin (at most 1,500 bins)"
    ]
