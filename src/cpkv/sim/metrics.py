"""Per-step recording and the report metrics of SPEC section 11 (defined in ``docs/metrics.md``): the
``StepRecorder``, the metric formulas, and ``policy_metrics``, the metrics of one policy's replay."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np


class StepRecorder:
    """Records, per simulated step, the used pages per lane and (prefill steps) the work per rank.

    ``record(time_ms, used, work)``: ``used`` int ``[C]`` device pages in use after the step (cached or
    held by a request); ``work`` float ``[C]`` cost-model work of each rank (ms), or None for a step
    that computed no prefill token. Kept in blocks of ``STEP_BLOCK`` rows (no object per step): a step
    costs ``8 + 4 C`` bytes, a prefill step ``8 C`` more (C=8: 104 bytes, so 650,000 steps about 66 MB).
    """

    def __init__(self, cp_size: int) -> None:
        self.cp_size = cp_size
        self._time = array("d")
        self._used = _Rows(cp_size, np.int32)
        self._work = _Rows(cp_size, np.float64)

    def record(self, time_ms: float, used: np.ndarray, work: np.ndarray | None) -> None:
        """Append one step (see class docstring)."""
        self._time.append(time_ms)
        self._used.append(used)
        if work is not None:
            self._work.append(work)

    @property
    def num_steps(self) -> int:
        """Steps recorded so far."""
        return len(self._time)

    def used(self) -> np.ndarray:
        """``[steps, C]`` int32 used pages per lane after each step."""
        return self._used.rows()

    def times(self) -> np.ndarray:
        """``[steps]`` float64 simulated end time of each step, ms."""
        return np.array(self._time, dtype=np.float64)

    def work(self) -> np.ndarray:
        """``[prefill steps, C]`` float64 work per rank, ms."""
        return self._work.rows()


STEP_BLOCK = 4096
"""Rows per block of ``StepRecorder``'s arrays."""


class _Rows:
    """Rows of ``width`` values of one dtype, appended one at a time into blocks of ``STEP_BLOCK`` rows."""

    def __init__(self, width: int, dtype: type) -> None:
        self.full: list[np.ndarray] = []
        self.block = np.empty((STEP_BLOCK, width), dtype=dtype)
        self.n = 0

    def append(self, row: np.ndarray) -> None:
        self.block[self.n] = row
        self.n += 1
        if self.n == STEP_BLOCK:
            self.full.append(self.block)
            self.block = np.empty_like(self.block)
            self.n = 0

    def rows(self) -> np.ndarray:
        """``[rows, width]``: the rows appended, in order (a new array)."""
        return np.concatenate([*self.full, self.block[: self.n]])


BUSY_FRACTION = 0.1
"""``lane_imbalance_mean`` counts the steps whose mean lane usage is at least this fraction of
``pages_per_lane`` (of each lane's own size when lanes differ; near-empty start-up steps are left out); the
lanes plot draws the same steps."""


def lane_metrics(used: np.ndarray, pages_per_lane: int | Sequence[int]) -> dict:
    """SPEC section 11 lane metrics from ``used`` ``[steps, C]`` pages (docs/metrics.md).

    Returns ``lane_pages_peak`` (int ``[C]``: ``max_t used_r``), and over the *same* steps, the busy
    ones (``mean_r u >= BUSY_FRACTION``, a fraction of a full lane), the ratio ``max_r u / mean_r u``'s
    maximum ``lane_imbalance_peak`` and mean ``lane_imbalance_mean``, so ``peak >= mean`` always; where
    ``u_r = used_r / Q_r`` is lane r's fill. With no busy step ``lane_imbalance_mean`` is None (a pool
    never that full says nothing about balance) and ``lane_imbalance_peak`` the maximum over the steps
    with any page in use (1.0 with none). With equal lanes (one int Q) the ratios are on pages (dividing
    every lane by the same Q changes no ratio); with unequal lanes (``pages_per_lane`` a sequence of C
    ints, e.g. ``[9, 10, 10, 10]``) a pool filled in proportion to each lane's size scores 1.0. Example
    used ``[[2, 0], [4, 2]]``, Q=4: peak lanes [4, 2], ratios 2 and 4 / 3: peak 2, mean 5 / 3.
    """
    caps = np.broadcast_to(np.asarray(pages_per_lane, dtype=np.float64), (used.shape[1],))  # [C]
    if used.shape[0] == 0:
        return {
            "lane_pages_peak": [0] * used.shape[1],
            "lane_imbalance_peak": 1.0,
            "lane_imbalance_mean": None,
        }
    fill = used.astype(np.float64) / caps  # [steps, C]
    mean = fill.mean(axis=1)
    busy = mean >= BUSY_FRACTION  # of a full lane
    steps = busy if busy.any() else mean > 0
    ratio = fill[steps].max(axis=1) / mean[steps]  # [steps counted]
    return {
        "lane_pages_peak": used.max(axis=0).astype(np.int64).tolist(),
        "lane_imbalance_peak": float(ratio.max()) if ratio.size else 1.0,
        "lane_imbalance_mean": float(ratio.mean()) if busy.any() else None,
    }


def compute_imbalance(work: np.ndarray) -> float:
    """``sum_t max_r work_r / sum_t mean_r work_r`` over prefill steps (SPEC section 11); 1.0 with no work.

    The headline compute figure: each step lasts as long as its busiest rank, so this is the factor by
    which prefill time exceeds perfect balance; a step weighs as much as its work. Example work
    ``[[1, 1], [3, 1]]``: (1 + 3) / (1 + 2) = 4 / 3 (``compute_imbalance_mean`` gives 1.25).
    """
    total = float(work.mean(axis=1).sum()) if work.size else 0.0
    return float(work.max(axis=1).sum()) / total if total > 0 else 1.0


def compute_imbalance_mean(work: np.ndarray) -> float:
    """Mean over prefill steps of ``max_r work_r / mean_r work_r`` (SPEC section 11); 1.0 with no steps.

    Secondary figure: every step counts the same, so steps of one tiny request dominate it. Example
    work ``[[1, 1], [3, 1]]``: (1 + 1.5) / 2 = 1.25.
    """
    mean = work.mean(axis=1) if work.size else np.zeros(0)
    ok = mean > 0
    return float((work[ok].max(axis=1) / mean[ok]).mean()) if ok.any() else 1.0


def percentile_ms(values: Sequence[float], q: float, unfinished: int = 0) -> float | None:
    """The q-th percentile (linear interpolation, numpy's default) of the TTFTs of every request, in ms.

    ``values``: the TTFTs of the requests that got their first token; ``unfinished`` more requests never
    did and count as later than any of them (infinitely late). None when there is no request, or when the
    percentile falls on an unfinished request (its interpolation touches one): a percentile is never a
    finite number that leaves the slowest requests out. Example: 64 finished of 192, p50 and p99 None.
    """
    n = len(values) + unfinished
    if n == 0:
        return None
    pos = q / 100 * (n - 1)
    lo = int(np.floor(pos))
    hi = lo + (pos > lo)
    if hi >= len(values):
        return None
    if not unfinished:
        return float(np.percentile(np.asarray(values, dtype=np.float64), q))
    v = np.sort(np.asarray(values, dtype=np.float64))
    return float(v[lo] + (pos - lo) * (v[hi] - v[lo]))


def slo_attainment(values: Sequence[float], total: int, slo_ms: float | None) -> float | None:
    """The share of all ``total`` requests whose TTFT is at most ``slo_ms`` (``values``: TTFTs of the
    requests that got their first token, ms; an unfinished request misses it). None without an SLO or
    without a request."""
    if slo_ms is None or total == 0:
        return None
    return int(np.count_nonzero(np.asarray(values, dtype=np.float64) <= slo_ms)) / total


def policy_metrics(run, used: np.ndarray, wall_s: float) -> dict:
    """The report metrics of one finished replay (docs/metrics.md; ``sim_wall_s`` is ``wall_s`` rounded).

    ``run``: the ``sim.engine.PolicyRun`` (its counters, recorder, allocator, prefix cache, speculative
    decoder and KV storage design are read, nothing is changed); ``used``: its recorder's ``used()`` pages per
    step. Page counts of the cache are in pages of P tokens (a virtual block of ``interleaved-vblock`` is C).
    """
    counters = run.cache.counters()
    unit = run.storage.pages_per_unit  # pages of P tokens per page of the design's cache
    reasons: dict[str, int] = {}
    for why in run.rejections.values():
        code = why.split(":", 1)[0]
        reasons[code] = reasons.get(code, 0) + 1
    work = run.rec.work()
    return {
        "requests_total": len(run.requests),
        "requests_finished": run.finished,
        "requests_rejected": len(run.rejections),
        "prefill_tokens": run.prefill_tokens,
        "cache_hit_tokens": run.cache_hit_tokens,
        **lane_metrics(used, run.cfg.lane_capacities),
        "compute_imbalance": compute_imbalance(work),
        "compute_imbalance_mean": compute_imbalance_mean(work),
        "owner_lane_exhausted": run.owner_lane_exhausted,
        "load_back_owner_lane_capacity_failed": counters["load_back_owner_lane_capacity_failed"],
        "evicted_pages": int(sum(counters["evicted_pages"])) * unit,
        "livelock_detected": run.livelock is not None,
        "requests_unfinished": len(run.requests) - len(run.ttft_ms),
        "ttft_ms_p50": percentile_ms(run.ttft_ms, 50, len(run.requests) - len(run.ttft_ms)),
        "ttft_ms_p99": percentile_ms(run.ttft_ms, 99, len(run.requests) - len(run.ttft_ms)),
        "slo_attainment": slo_attainment(run.ttft_ms, len(run.requests), run.cfg.ttft_slo_ms),
        "mqa_logits_peak_elements": run.logits_peak,
        "logits_budget_elements": run.cfg.logits_budget_elements,
        "logits_budget_cuts": run.logits_budget_cuts,
        "sim_wall_s": round(wall_s, 3),
        "steps": run.rec.num_steps,
        "sim_time_ms": run.now_ms,
        "leaked_pages": run.leaked_pages(),
        "retractions": run.retractions,
        **(run.spec.metrics() if run.spec else {}),
        "load_back_pages": counters["load_backs"] * unit,
        "host_backups": counters["backups"] * unit,
        "rejection_reasons": dict(sorted(reasons.items())),
        "livelock": run.livelock,
        "rejections": {str(k): v for k, v in sorted(run.rejections.items())[:100]},
        **run.storage.metrics(run),
    }


def livelock_finding(run, stalled: int) -> dict:
    """``report.json``'s ``livelock`` of a replay stopped after ``stalled`` steps without progress: the lane
    last short, the blocked (admitted) and waiting requests, free pages per lane, failure counts (``run``: a
    ``PolicyRun``, read only)."""
    blocked = [r.req.req_id for r in run.running + run.decoding]
    return {
        "lane": run.last_short_lane,
        "stalled_steps": stalled,
        "blocked_requests": blocked[:32],
        "blocked_count": len(blocked),
        "waiting_count": len(run.waiting),
        "free_pages_per_lane": run.alloc.free_pages_per_lane().tolist(),
        "owner_lane_exhausted": run.owner_lane_exhausted,
    }
