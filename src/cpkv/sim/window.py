"""Traffic as the planner will see it: a time window of a workload (``--start``, ``--duration``) and its
arrivals compressed (``--rate-scale``), the same requests (docs/metrics.md, "Traffic window")."""

from __future__ import annotations

import math
from dataclasses import replace

from ..errors import ConfigError
from .trace import Request
from .workload import WorkloadSpec


def traffic_window(
    spec: WorkloadSpec,
    start_s: float | None = None,
    duration_s: float | None = None,
    rate_scale: float | None = None,
) -> WorkloadSpec:
    """The requests of ``spec`` arriving in ``[start_s, start_s + duration_s)`` seconds (from the start, to the
    end when ``duration_s`` is None), their arrival times shifted so the window starts at 0 and divided by
    ``rate_scale`` (2.0: twice the traffic, the same requests in half the time); renumbered 0.. in order
    (``Request.req_id`` is a position). Returns ``spec`` unchanged when all three are None, else a copy whose
    ``window`` records them and whose description names them.

    Raises:
        ConfigError: ``start_s`` < 0, ``duration_s`` <= 0, ``rate_scale`` <= 0 (or not finite), or no request
            arrives in the window (naming the trace's span).
    """
    if start_s is None and duration_s is None and rate_scale is None:
        return spec
    for name, value, low_ok in (
        ("start", start_s, True),
        ("duration", duration_s, False),
        ("rate_scale", rate_scale, False),
    ):
        if value is None:
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < 0 or (value == 0 and not low_ok):
            raise ConfigError(
                f"--{name.replace('_', '-')} must be a finite number {'>=' if low_ok else '>'} 0, got {value!r}"
            )
    lo = 1000.0 * (start_s or 0.0)
    hi = math.inf if duration_s is None else lo + 1000.0 * duration_s
    scale = float(rate_scale or 1.0)
    kept = [r for r in spec.requests if lo <= r.arrival_ms < hi]
    if not kept:
        last = spec.requests[-1].arrival_ms / 1000 if spec.requests else 0.0
        raise ConfigError(
            f"no request arrives in the window {lo / 1000:g} s to {hi / 1000:g} s (the workload spans "
            f"0 to {last:,.1f} s)"
        )
    requests = tuple(
        Request(i, (r.arrival_ms - lo) / scale, r.input_length, r.output_length, r.hash_ids)
        for i, r in enumerate(kept)
    )
    window = {
        "start_s": start_s or 0.0,
        "duration_s": duration_s,
        "rate_scale": scale,
        "requests_in_window": len(kept),
    }
    span = f"{lo / 1000:g}-{hi / 1000:g} s" if duration_s is not None else f"from {lo / 1000:g} s"
    return replace(
        spec,
        requests=requests,
        window=window,
        description=f"{spec.description}, window {span}" + (f", rate x{scale:g}" if scale != 1 else ""),
    )
