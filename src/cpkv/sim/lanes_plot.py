"""``lanes.png`` of ``cpkv simulate``: per policy, lane imbalance over time and each lane's peak usage.

One row per policy: on the left the imbalance curve ``max_r used_r(t) / mean_r used_r(t)`` of every step
that ``lane_imbalance_mean`` counts (docs/metrics.md), with that mean as a line; on the right the
``lane_pages_peak`` bars against the lane capacity ``Q``. Numbers carry the table's precision (4 decimals
for ratios); the title names the workload, C, P and Q; the legend sits below the panels.
"""

from __future__ import annotations

import gc
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .metrics import BUSY_FRACTION, STEP_BLOCK

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MAX_POINTS = 1500
"""Longer runs are drawn as ``MAX_POINTS`` time bins: the min-max band of each bin and its max as a line,
so no spike is lost to thinning."""


def imbalance_curve(
    used: np.ndarray, pages_per_lane: int | Sequence[int], busy_fraction: float = BUSY_FRACTION
) -> np.ndarray:
    """``[steps]`` float64 ``max_r used / mean_r used`` per step; NaN where the mean lane usage is below
    ``busy_fraction * pages_per_lane`` (by default the steps ``lane_imbalance_mean`` leaves out; 0: every
    step with pages in use). With one capacity per lane (unequal lanes) the ratio is of fills
    ``used_r / Q_r``, as ``lane_metrics``.

    ``used``: int ``[steps, C]`` pages. Example Q=10, used ``[[1, 0], [4, 2]]`` -> ``[nan, 4/3]``. The fills
    are float64 ``STEP_BLOCK`` steps at a time (a day-scale replay's all at once: 8 C bytes a step, twice).
    """
    used = np.asarray(used)
    if used.size == 0:
        return np.zeros(used.shape[0])
    caps = np.broadcast_to(np.asarray(pages_per_lane, dtype=np.float64), (used.shape[1],))  # [C]
    out = np.full(used.shape[0], np.nan)
    for lo in range(0, used.shape[0], STEP_BLOCK):
        block = used[lo : lo + STEP_BLOCK].astype(np.float64)  # [block, C]
        fill = block / caps if caps.all() else block
        mean = fill.mean(axis=1)
        busy = (mean >= (busy_fraction if caps.all() else 0.0)) & (mean > 0)
        out[lo : lo + STEP_BLOCK][busy] = fill[busy].max(axis=1) / mean[busy]
    return out


def binned(times: np.ndarray, values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(t, lo, hi)``: ``values`` (NaN = gap) in ``bins`` equal runs of steps; ``t`` the last time of each
    bin, ``lo``/``hi`` its min/max ignoring NaN (NaN when the whole bin is). Unchanged when shorter.

    Example times [1, 2, 3, 4], values [1, nan, 3, 2], bins 2 -> t [2, 4], lo [1, 2], hi [1, 3].
    """
    n = values.shape[0]
    if n <= bins:
        return times, values, values
    k = -(-n // bins)
    pad = k * (-(-n // k)) - n
    v = np.concatenate([values, np.full(pad, np.nan)]).reshape(-1, k)
    t = np.concatenate([times, np.full(pad, times[-1])]).reshape(-1, k)[:, -1]
    return t, np.fmin.reduce(v, axis=1), np.fmax.reduce(v, axis=1)


def lanes_png(results: list, config: dict, status: str = "complete") -> bytes:
    """``lanes_figure`` rendered as PNG bytes (110 dpi)."""
    return png_bytes(lambda: lanes_figure(results, config, status))


def png_bytes(make_figure) -> bytes:
    """The matplotlib figure ``make_figure()`` returns as PNG bytes (110 dpi), closed and freed before return."""
    plt = load_matplotlib()
    fig = make_figure()  # only this frame holds it, so the collection below frees it
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    # The figure's renderer sits in reference cycles and keys matplotlib's weak text-metrics cache: free
    # it now. Left to a later collection it dies during the next policy's replay, and a Ctrl-C that lands
    # in that weakref callback is swallowed ("Exception ignored"): the interrupt would be lost.
    del fig
    gc.collect()
    return buf.getvalue()


def load_matplotlib():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def lanes_figure(results: list, config: dict, status: str = "complete"):
    """The matplotlib ``Figure`` (Agg backend). ``results``: ``PolicyResult`` list; ``config``: the
    report's config dict (``cp_size``, ``page_size``, ``pages_per_lane``, ``workload_description``,
    ``policies``); ``status``: the report status, shown in the title unless ``complete``."""
    plt = load_matplotlib()

    Q = config.get("pages_per_lane", 0)  # an int, or a list of one per lane
    n = max(len(results), 1)
    fig = plt.figure(figsize=(12, 1.3 + 2.5 * n), layout="constrained")
    grid = fig.add_gridspec(n, 2, width_ratios=[3, 1.3])
    curve_axes: list[Axes] = []
    bar_axes: list[Axes] = []
    for i, r in enumerate(results):
        ax = fig.add_subplot(grid[i, 0], sharex=curve_axes[0] if curve_axes else None)
        bx = fig.add_subplot(grid[i, 1], sharey=bar_axes[0] if bar_axes else None)
        curve_axes.append(ax)
        bar_axes.append(bx)
        _draw_curve(ax, r, Q)
        _draw_bars(bx, r, Q)
        _row_title(ax, r)
    _share_comparable_ylim(curve_axes)
    if curve_axes:
        curve_axes[-1].set_xlabel("simulated time (s)")
        bar_axes[-1].set_xlabel("lane")
        handles, labels = _legend_entries(*curve_axes, *bar_axes)
        fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(_title(config, results, status), fontsize=11, x=0.01, ha="left")
    return fig


def _title(config: dict, results: list, status: str) -> str:
    head = f"cpkv simulate: {config.get('workload_description') or config.get('workload', '')}"
    stats = config.get("workload_stats") or {}
    line = (
        f"{stats.get('num_requests', 0):,} requests, {stats.get('prompt_tokens_total', 0) / 1e6:,.2f}M prompt "
        f"tokens; C={config.get('cp_size')} ranks, P={config.get('page_size')} tokens per page, "
        f"Q={_capacity_text(config.get('pages_per_lane', 0))} pages per lane"
    )
    if status != "complete":
        done = [r.policy for r in results]
        pending = [p for p in config.get("runs", config.get("policies", [])) if p not in done]
        line += f"  [{status}: {', '.join(pending) or 'some policies'} not run]"
    return f"{head}\n{line}"


def _row_title(ax, r) -> None:
    m = r.metrics
    mean = m["lane_imbalance_mean"]
    ax.set_title(
        f"{r.policy}:  lane_imbalance_peak {m['lane_imbalance_peak']:.4f}   lane_imbalance_mean "
        f"{'- (no step counted)' if mean is None else f'{mean:.4f}'}",
        fontsize=10,
        loc="left",
    )
    if m.get("livelock_detected"):
        lane = (m.get("livelock") or {}).get("lane", -1)
        where = f" (lane {lane} full)" if lane is not None and lane >= 0 else ""
        ax.set_title(f"LIVELOCK{where}", fontsize=10, loc="right", color="tab:red", fontweight="bold")


def _capacity_text(Q) -> str:
    return ",".join(map(str, Q)) if isinstance(Q, (list, tuple)) else f"{int(Q):,}"


def _draw_curve(ax, r, Q) -> None:
    ratio = imbalance_curve(r.used, Q)
    times = np.asarray(r.times_ms, dtype=np.float64) / 1000.0
    t, lo, hi = binned(times, ratio, MAX_POINTS)
    share = f"{BUSY_FRACTION:g}"
    every = imbalance_curve(r.used, Q, busy_fraction=0.0)  # every step with pages in use, under the counted
    if (np.isfinite(every) & ~np.isfinite(ratio)).any():
        ta, _, ha = binned(times, every, MAX_POINTS)
        ax.plot(
            ta,
            ha,
            color="0.6",
            lw=0.8,
            zorder=2,
            label=f"the same over all steps (mean < {share} Q: not counted)",
        )
    if t.shape[0] < ratio.shape[0]:
        ax.fill_between(
            t,
            lo,
            hi,
            color="tab:blue",
            alpha=0.3,
            lw=0,
            zorder=2,
            label=f"min-max of the steps in each time bin (at most {MAX_POINTS:,} bins)",
        )
        label = f"max_r used / mean_r used, max of each time bin (steps with mean ≥ {share} Q)"
    else:
        label = f"max_r used / mean_r used per step (steps with mean ≥ {share} Q)"
    ax.plot(t, hi, color="tab:blue", lw=1.0, zorder=3, label=label)
    mean = r.metrics["lane_imbalance_mean"]
    counted = np.flatnonzero(np.isfinite(ratio))
    if counted.size and mean is not None:  # over the steps it averages
        ax.hlines(
            mean,
            times[counted[0]],
            times[counted[-1]],
            color="tab:orange",
            lw=1.2,
            ls="--",
            zorder=2.5,
            label="lane_imbalance_mean, over the counted steps (value in each row title)",
        )
    ax.axhline(1.0, color="0.5", lw=0.6, ls=":", zorder=1, label="1.0 = every lane equally used")
    mean = 1.0 if mean is None else mean
    top = np.nanmax(hi) if np.isfinite(hi).any() else mean
    span = max(top, mean) - 1.0
    ax.set_ylim(1.0 - 0.05 * max(span, 1e-4), max(top, mean) + 0.12 * max(span, 1e-4))
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_ylabel("max / mean used")
    ax.grid(axis="y", lw=0.3, alpha=0.5)


SHARE_Y_WITHIN = 20.0
"""Imbalance panels share one y range when their excesses over 1.0 differ by at most this factor, so
near-equal policies are compared on one scale; a starving policy (legacy at 8.0) keeps its own."""


def _share_comparable_ylim(axes: list) -> None:
    if len(axes) < 2:
        return
    limits = [ax.get_ylim() for ax in axes]
    excess = [hi - 1.0 for _, hi in limits]
    if max(excess) <= SHARE_Y_WITHIN * min(excess):
        shared = (min(lo for lo, _ in limits), max(hi for _, hi in limits))
        for ax in axes:
            ax.set_ylim(shared)


def _draw_bars(ax, r, Q) -> None:
    peaks = np.asarray(r.metrics["lane_pages_peak"], dtype=np.int64)
    lanes = np.arange(peaks.shape[0])
    ax.bar(
        lanes, peaks, color="tab:green", width=0.75, label="lane_pages_peak (peak used pages of each lane)"
    )
    if isinstance(Q, (list, tuple)):  # unequal lanes: each lane's own capacity over its bar
        ax.hlines(
            Q, lanes - 0.45, lanes + 0.45, color="k", lw=0.9, ls="--", label="capacity Q_r of each lane"
        )
        Q = max(Q)
    else:
        ax.axhline(Q, color="k", lw=0.9, ls="--", label=f"capacity Q = {Q:,} pages per lane")
    top = Q * 1.15 if Q else max(int(peaks.max(initial=0)), 1) * 1.15
    if peaks.shape[0] <= 16:  # the value on each bar: inside a tall bar, above a short one
        for x, v in zip(lanes.tolist(), peaks.tolist(), strict=True):
            inside = v > 0.3 * top
            ax.text(
                x,
                v * 0.97 if inside else v,
                f" {v:,} ",
                ha="center",
                va="top" if inside else "bottom",
                fontsize=7,
                rotation=90,
                color="white" if inside else "black",
            )
    ax.set_ylim(0, top)
    ax.set_xticks(lanes if peaks.shape[0] <= 16 else lanes[:: -(-peaks.shape[0] // 16)])
    ax.yaxis.set_major_formatter("{x:,.0f}")
    ax.set_ylabel("peak used pages")
    lo, hi = (int(peaks.min()), int(peaks.max())) if peaks.size else (0, 0)
    ax.set_title(f"lane_pages_peak {lo:,}-{hi:,}", fontsize=10, loc="left")


def _legend_entries(*axes) -> tuple[list, list]:
    """Handles and labels of all ``axes``, each label once, in first-seen order."""
    entries: dict = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, h)
    return list(entries.values()), list(entries)
