"""The report metrics of SPEC section 11 (defined in ``docs/metrics.md``): the ``METRICS`` table that names
each one once, the ``StepRecorder``, the metric formulas, and ``policy_metrics``, the metrics of one policy's
replay."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .counters import ReplayCounters

CORE, SPEC, STORAGE, RUN = "core", "spec", "storage", "run"
"""Who fills a metric: ``policy_metrics`` (core), ``SpecDecoder.metrics`` (spec, with ``--spec-draft-tokens``),
``KVStorage.metrics`` (storage), ``sim.replay.replay`` (run: the replay's label)."""

SUM, MAX, ANY, SAME, LANES_MAX, LANES_SUM = "sum", "max", "any", "same", "lanes-max", "lanes-sum"
COUNTS, MERGED, PER_GROUP = "counts", "merged", "per-group"
"""Rules that combine a metric over a sweep point's groups (``sweep.groups.RULES`` says what each does); the
others are tuples: ``("pooled", q)``, ``("weighted", metric)``, ``("ratio", a, b)``."""


class Metric(NamedTuple):
    """One metric of ``report.json``: ``name``; ``group`` (``CORE`` | ``SPEC`` | ``STORAGE`` | ``RUN``: who
    fills it); ``combine`` (its rule over a sweep point's groups, ``sweep.groups.RULES``); ``unit`` (as
    docs/metrics.md's table writes it); ``column``: the section of the side-by-side table and
    ``summary.csv`` that shows it (``CORE``: always, ``SPEC``: with speculative decode, ``STORAGE``: when
    designs are compared; None: ``report.json`` only). Its definition is its row in docs/metrics.md's
    metric table of its group (``tests/unit/sim/test_metric_table.py`` holds the two together)."""

    name: str
    group: str
    combine: object
    unit: str
    column: str | None


METRICS: tuple[Metric, ...] = (
    # the side-by-side table's and summary.csv's rows, in order (REPORT_FIELDS)
    Metric("requests_total", CORE, SUM, "requests", CORE),
    Metric("requests_finished", CORE, SUM, "requests", CORE),
    Metric("requests_rejected", CORE, SUM, "requests", CORE),
    Metric("requests_unfinished", CORE, SUM, "requests", CORE),
    Metric("prefill_tokens", CORE, SUM, "tokens", CORE),
    Metric("cache_hit_tokens", CORE, SUM, "tokens", CORE),
    Metric("lane_pages_peak", CORE, LANES_MAX, "pages", CORE),
    Metric("lane_imbalance_peak", CORE, MAX, "ratio", CORE),
    Metric("lane_imbalance_mean", CORE, MAX, "ratio", CORE),
    Metric("compute_imbalance", CORE, MAX, "ratio", CORE),
    Metric("compute_imbalance_mean", CORE, MAX, "ratio", CORE),
    Metric("owner_lane_exhausted", CORE, SUM, "events", CORE),
    Metric("load_back_owner_lane_capacity_failed", CORE, SUM, "events", CORE),
    Metric("evicted_pages", CORE, SUM, "pages", CORE),
    Metric("livelock_detected", CORE, ANY, "bool", CORE),
    Metric("retractions", CORE, SUM, "events", CORE),
    Metric("ttft_ms_p50", CORE, ("pooled", 50), "ms", CORE),
    Metric("ttft_ms_p99", CORE, ("pooled", 99), "ms", CORE),
    Metric("slo_attainment", CORE, ("weighted", "requests_total"), "ratio", CORE),
    Metric("mqa_logits_peak_elements", CORE, MAX, "elements", CORE),
    Metric("logits_budget_elements", CORE, SAME, "elements", CORE),
    Metric("logits_budget_cuts", CORE, SUM, "chunks", CORE),
    Metric("sim_wall_s", CORE, SUM, "s", CORE),
    # report.json only
    Metric("steps", CORE, SUM, "steps", None),
    Metric("sim_time_ms", CORE, MAX, "ms", None),
    Metric("load_back_pages", CORE, SUM, "pages", None),
    Metric("host_backups", CORE, SUM, "pages", None),
    Metric("rejection_reasons", CORE, COUNTS, "requests", None),
    Metric("rejections", CORE, MERGED, "-", None),
    Metric("livelock", CORE, PER_GROUP, "-", None),
    # shown with speculative decode (SPEC_DECODE_FIELDS): the leak check, then the drafts' figures
    Metric("leaked_pages", CORE, SUM, "pages", SPEC),
    Metric("spec_verify_steps", SPEC, SUM, "steps", None),
    Metric("spec_accept_length", SPEC, ("weighted", "spec_verify_steps"), "tokens", SPEC),
    Metric("spec_accepted_drafts_per_step", SPEC, ("weighted", "spec_verify_steps"), "tokens", SPEC),
    Metric("draft_pages_allocated", SPEC, SUM, "pages", SPEC),
    Metric("draft_pages_released", SPEC, SUM, "pages", SPEC),
    Metric("draft_pages_per_lane", SPEC, LANES_SUM, "pages", SPEC),
    Metric("draft_lane_imbalance", SPEC, MAX, "ratio", SPEC),
    # the KV storage design's (STORAGE_FIELDS)
    Metric("kv_storage", STORAGE, SAME, "-", STORAGE),
    Metric("kv_capacity_tokens", STORAGE, SUM, "tokens", STORAGE),
    Metric("cache_hit_rate", STORAGE, ("ratio", "cache_hit_tokens", "prefill_tokens"), "ratio", STORAGE),
    Metric("prefill_tokens_recomputed", STORAGE, SUM, "tokens", STORAGE),
    Metric("kv_allgather_bytes_per_rank", STORAGE, MAX, "bytes", STORAGE),
    Metric("kv_remote_read_bytes_per_rank", STORAGE, MAX, "bytes", STORAGE),
    Metric("kv_comm_ms", STORAGE, MAX, "ms", STORAGE),
    Metric("kv_comm_exposed_ms", STORAGE, MAX, "ms", STORAGE),
    # the label replay.py gives the replay
    Metric("cp_strategy", RUN, SAME, "-", None),
)
"""Every metric of ``report.json``, each once (docs/metrics.md defines them). Adding a metric: one entry
here, its row in docs/metrics.md, and the code that fills it (the dict of its ``group``)."""


def metric_names(*, group: str | None = None, column: str | None = None) -> tuple[str, ...]:
    """Names of ``METRICS`` of ``group`` and/or shown in ``column``, in table order (both None: all).
    Example: ``metric_names(column=STORAGE)[0]`` -> ``"kv_storage"``."""
    return tuple(
        m.name
        for m in METRICS
        if (group is None or m.group == group) and (column is None or m.column == column)
    )


class StepRecorder:
    """Records, per simulated step, the used pages per lane and (prefill steps) the work per rank.

    ``record(time_ms, used, work)``: ``used`` int ``[C]`` device pages in use after the step (cached or
    held by a request); ``work`` float ``[C]`` cost-model work of each rank (ms), or None for a step
    that computed no prefill token. Kept in blocks of ``STEP_BLOCK`` rows (no object per step); a prefill
    step's work is kept as its busiest rank's and its mean over the ranks (``step_work``, what the compute
    metrics read), each block reduced when full. A step costs ``8 + 4 C`` bytes, a prefill step 16 more
    (C=8: 56 bytes, so 650,000 steps about 36 MB).
    """

    def __init__(self, cp_size: int) -> None:
        self.cp_size = cp_size
        self._time = array("d")
        self._used = _Rows(cp_size, np.int32)
        self._work = np.empty((STEP_BLOCK, cp_size), dtype=np.float64)  # the prefill steps not reduced yet
        self._work_n = 0
        self._work_max: list[np.ndarray] = []  # float64 [prefill steps] per block reduced
        self._work_mean: list[np.ndarray] = []

    def record(self, time_ms: float, used: np.ndarray, work: np.ndarray | None) -> None:
        """Append one step (see class docstring)."""
        self._time.append(time_ms)
        self._used.append(used)
        if work is not None:
            self._work[self._work_n] = work
            self._work_n += 1
            if self._work_n == STEP_BLOCK:
                self._reduce_work()

    def _reduce_work(self) -> None:
        peak, mean = step_work(self._work[: self._work_n])
        self._work_max.append(peak)
        self._work_mean.append(mean)
        self._work_n = 0

    @property
    def num_steps(self) -> int:
        """Steps recorded so far."""
        return len(self._time)

    @property
    def end_ms(self) -> float:
        """Simulated time at the end of the last step recorded, ms (0.0 before any step)."""
        return self._time[-1] if self._time else 0.0

    def used(self) -> np.ndarray:
        """``[steps, C]`` int32 used pages per lane after each step. The recorder keeps the array it returns
        (its blocks joined once, then freed): a second call without a step between returns the same array,
        not a copy; do not modify it."""
        return self._used.rows()

    def times(self) -> np.ndarray:
        """``[steps]`` float64 simulated end time of each step, ms."""
        return np.array(self._time, dtype=np.float64)

    def work(self) -> tuple[np.ndarray, np.ndarray]:
        """``(max, mean)``: float64 ``[prefill steps]`` each, the busiest rank's work and the mean work over
        the ranks of each prefill step, ms (``step_work`` of the rows recorded). Kept as ``used``: the same
        arrays until a prefill step is recorded; do not modify them."""
        if self._work_n:
            self._reduce_work()
        if len(self._work_max) != 1:  # joined once, as ``used``
            self._work_max = [np.concatenate([np.zeros(0), *self._work_max])]
            self._work_mean = [np.concatenate([np.zeros(0), *self._work_mean])]
        return self._work_max[0], self._work_mean[0]


STEP_BLOCK = 4096
"""Rows per block of ``StepRecorder``'s arrays, and per chunk of the lane metrics' float arrays."""


class _Rows:
    """Rows of ``width`` values of one dtype, appended one at a time into blocks of ``STEP_BLOCK`` rows."""

    def __init__(self, width: int, dtype: type) -> None:
        self.full: list[np.ndarray] = []  # full blocks (after ``rows``: one array of every row before)
        self.block: np.ndarray = np.empty((STEP_BLOCK, width), dtype=dtype)
        self.n = 0

    def append(self, row: np.ndarray) -> None:
        self.block[self.n] = row
        self.n += 1
        if self.n == STEP_BLOCK:
            self.full.append(self.block)
            self.block = np.empty_like(self.block)
            self.n = 0

    def rows(self) -> np.ndarray:
        """``[rows, width]``: the rows appended, in order. Joined into one array that replaces the blocks
        (no second copy lives on) and is returned as is until a row is appended."""
        if self.n or len(self.full) != 1:
            self.full = [np.concatenate([*self.full, self.block[: self.n]])]
            self.n = 0  # the block's rows are in the joined array: the next row overwrites them
        return self.full[0]


def step_work(work: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(max, mean)`` over the ranks of each step's work: float64 ``[steps]`` each, from ``work`` float
    ``[steps, C]`` (ms). Row by row, so computing it block by block gives the same bits. Example work
    ``[[1, 1], [3, 1]]``: max ``[1, 3]``, mean ``[1, 2]``."""
    work = np.asarray(work, dtype=np.float64)
    return work.max(axis=1), work.mean(axis=1)


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

    Memory: the fills are float64 ``STEP_BLOCK`` steps at a time (a day-scale replay's steps at once would
    be 8 C bytes a step, twice); the ratios counted are one float64 a step.
    """
    caps = np.broadcast_to(np.asarray(pages_per_lane, dtype=np.float64), (used.shape[1],))  # [C]
    if used.shape[0] == 0:
        return {
            "lane_pages_peak": [0] * used.shape[1],
            "lane_imbalance_peak": 1.0,
            "lane_imbalance_mean": None,
        }
    ratio = _fill_ratios(used, caps, busy=True)  # [busy steps]
    busy = ratio.size > 0
    if not busy:
        ratio = _fill_ratios(used, caps, busy=False)  # [steps with a page in use]
    return {
        "lane_pages_peak": used.max(axis=0).astype(np.int64).tolist(),
        "lane_imbalance_peak": float(ratio.max()) if ratio.size else 1.0,
        "lane_imbalance_mean": float(ratio.mean()) if busy else None,
    }


def _fill_ratios(used: np.ndarray, caps: np.ndarray, *, busy: bool) -> np.ndarray:
    """``max_r u / mean_r u`` (``u = used / caps``, float64) of the busy steps (``mean_r u >= BUSY_FRACTION``),
    or with ``busy`` False of the steps with a page in use, in step order; ``STEP_BLOCK`` steps at a time."""
    out = []
    for lo in range(0, used.shape[0], STEP_BLOCK):
        fill = used[lo : lo + STEP_BLOCK].astype(np.float64) / caps  # [block, C]
        mean = fill.mean(axis=1)
        steps = mean >= BUSY_FRACTION if busy else mean > 0  # BUSY_FRACTION: of a full lane
        out.append(fill[steps].max(axis=1) / mean[steps])
    return np.concatenate(out)


def compute_imbalance(peak: np.ndarray, mean: np.ndarray) -> float:
    """``sum_t max_r work_r / sum_t mean_r work_r`` over prefill steps (SPEC section 11); 1.0 with no work.

    ``peak``, ``mean``: float64 ``[prefill steps]``, ``step_work`` of the work per rank (ms). The headline
    compute figure: each step lasts as long as its busiest rank, so this is the factor by which prefill
    time exceeds perfect balance; a step weighs as much as its work. Example work ``[[1, 1], [3, 1]]``
    (``step_work``: peak ``[1, 3]``, mean ``[1, 2]``): (1 + 3) / (1 + 2) = 4 / 3 (``compute_imbalance_mean``
    gives 1.25).
    """
    total = float(mean.sum()) if mean.size else 0.0
    return float(peak.sum()) / total if total > 0 else 1.0


def compute_imbalance_mean(peak: np.ndarray, mean: np.ndarray) -> float:
    """Mean over prefill steps of ``max_r work_r / mean_r work_r`` (SPEC section 11); 1.0 with no steps.

    ``peak``, ``mean``: as ``compute_imbalance``'s. Secondary figure: every step counts the same, so steps
    of one tiny request dominate it. Example work ``[[1, 1], [3, 1]]``: (1 + 1.5) / 2 = 1.25.
    """
    ok = mean > 0
    return float((peak[ok] / mean[ok]).mean()) if ok.any() else 1.0


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


def policy_metrics(
    config,
    counters: ReplayCounters,
    recorder: StepRecorder,
    storage,
    drafts,
    leaked_pages: int,
    wall_s: float,
) -> dict:
    """The report metrics of one finished replay, in ``report.json``'s order (docs/metrics.md; the ``CORE``
    metrics of ``METRICS``, then ``drafts.metrics()`` and ``storage.metrics(counters)`` spliced in).

    Args:
        config: the replay's ``SimConfig``. counters: its ``ReplayCounters``. recorder: its ``StepRecorder``.
        storage: its ``KVStorage`` design (the prefix cache's counters are read, nothing is changed).
        drafts: its ``SpecDecoder``, or None without speculative decode. leaked_pages: pages in use that
            neither the cache nor a live request holds. wall_s: seconds the replay took (``sim_wall_s``,
            rounded to ms).

    Page counts of the cache are in pages of P tokens (a virtual block of ``interleaved-vblock`` is C).
    """
    c = counters
    cache = storage.cache.counters()
    unit = storage.pages_per_unit  # pages of P tokens per page of the design's cache
    reasons: dict[str, int] = {}
    for why in c.rejections.values():
        reasons[why.code] = reasons.get(why.code, 0) + 1
    work = recorder.work()  # (peak, mean) per prefill step
    unfinished = c.requests - len(c.ttft_ms)
    return {
        "requests_total": c.requests,
        "requests_finished": c.finished,
        "requests_rejected": len(c.rejections),
        "prefill_tokens": c.prefill_tokens,
        "cache_hit_tokens": c.cache_hit_tokens,
        **lane_metrics(recorder.used(), config.lane_capacities),
        "compute_imbalance": compute_imbalance(*work),
        "compute_imbalance_mean": compute_imbalance_mean(*work),
        "owner_lane_exhausted": c.owner_lane_exhausted,
        "load_back_owner_lane_capacity_failed": cache["load_back_owner_lane_capacity_failed"],
        "evicted_pages": int(sum(cache["evicted_pages"])) * unit,
        "livelock_detected": c.livelock is not None,
        "requests_unfinished": unfinished,
        "ttft_ms_p50": percentile_ms(c.ttft_ms, 50, unfinished),
        "ttft_ms_p99": percentile_ms(c.ttft_ms, 99, unfinished),
        "slo_attainment": slo_attainment(c.ttft_ms, c.requests, config.ttft_slo_ms),
        "mqa_logits_peak_elements": c.logits_peak,
        "logits_budget_elements": config.logits_budget_elements,
        "logits_budget_cuts": c.logits_budget_cuts,
        "sim_wall_s": round(wall_s, 3),
        "steps": recorder.num_steps,
        "sim_time_ms": recorder.end_ms,
        "leaked_pages": leaked_pages,
        "retractions": c.retractions,
        **(drafts.metrics() if drafts else {}),
        "load_back_pages": cache["load_backs"] * unit,
        "host_backups": cache["backups"] * unit,
        "rejection_reasons": dict(sorted(reasons.items())),
        "livelock": c.livelock,
        "rejections": {str(k): str(v) for k, v in sorted(c.rejections.items())[:100]},
        **storage.metrics(counters),
    }


def livelock_finding(
    counters: ReplayCounters,
    blocked: Sequence[int],
    waiting: int,
    free_pages_per_lane: np.ndarray,
    stalled: int,
) -> dict:
    """``report.json``'s ``livelock`` of a replay stopped after ``stalled`` steps without progress: the lane
    last short (``counters.last_short_lane``), the ``blocked`` (admitted) requests' ids, the count of
    ``waiting`` ones, ``free_pages_per_lane`` (int ``[C]``), failure counts."""
    return {
        "lane": counters.last_short_lane,
        "stalled_steps": stalled,
        "blocked_requests": list(blocked[:32]),
        "blocked_count": len(blocked),
        "waiting_count": waiting,
        "free_pages_per_lane": free_pages_per_lane.tolist(),
        "owner_lane_exhausted": counters.owner_lane_exhausted,
    }
