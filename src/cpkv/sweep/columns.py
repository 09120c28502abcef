"""The columns of ``cpkv sweep``'s results: every ``cpkv simulate`` report metric of a point, and the two
the sweep derives (docs/sweep.md, "Results")."""

from __future__ import annotations

from ..sim.report import REPORT_FIELDS, SPEC_DECODE_FIELDS

TIMING_FIELDS = ("sim_wall_s",)
"""Report fields that time the machine, not the design: kept in each point's file under ``points/``, left
out of ``results.csv`` / ``results.json`` so that those are identical whichever executor or machine ran."""

DERIVED_FIELDS = ("gpus", "cache_hit_rate")
"""``gpus = cp_size * groups``; ``cache_hit_rate = cache_hit_tokens / prompt tokens of the workload``
(every request's ``input_length``, all groups together)."""

METRIC_FIELDS = tuple(f for f in REPORT_FIELDS if f not in TIMING_FIELDS) + ("cache_hit_rate",)
"""The metric columns of ``results.csv``, in order; ``SPEC_DECODE_FIELDS`` follow when a point has them."""

TARGET_METRICS = tuple(
    f for f in (*METRIC_FIELDS, *SPEC_DECODE_FIELDS, "gpus")
    if f not in ("lane_pages_peak", "draft_pages_per_lane", "livelock_detected")
)  # fmt: skip
"""Numeric columns a ``target`` may bound (``ttft_ms_p99 <= 2000``, ``gpus <= 64``)."""
