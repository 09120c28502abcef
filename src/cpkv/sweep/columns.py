"""The columns of ``cpkv sweep``'s results: every ``cpkv simulate`` report metric of a point, and the two
the sweep derives (docs/sweep.md, "Results")."""

from __future__ import annotations

from ..sim.report import REPORT_FIELDS, SPEC_DECODE_FIELDS, STORAGE_FIELDS

TIMING_FIELDS = ("sim_wall_s",)
"""Report fields that time the machine, not the design: kept in each point's file under ``points/``, left
out of ``results.csv`` / ``results.json`` so that those are identical whichever executor or machine ran."""

DERIVED_FIELDS = ("gpus",)
"""``gpus = cp_size * groups``."""

METRIC_FIELDS = tuple(
    f for f in (*REPORT_FIELDS, *STORAGE_FIELDS) if f not in TIMING_FIELDS and f != "kv_storage"
)
"""The metric columns of ``results.csv``, in order (the design, ``kv_storage``, is a settings column);
``SPEC_DECODE_FIELDS`` follow when a point has them."""

TARGET_METRICS = tuple(
    f
    for f in (*METRIC_FIELDS, *SPEC_DECODE_FIELDS, "gpus")
    if f not in ("lane_pages_peak", "draft_pages_per_lane", "livelock_detected")
)
"""Numeric columns a ``target`` may bound (``ttft_ms_p99 <= 2000``, ``gpus <= 64``)."""
