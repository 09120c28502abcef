"""What one policy's replay counts as it runs: ``ReplayCounters``, the figures ``policy_metrics`` reports.

``sim.engine.PolicyRun`` owns one and updates it each step; ``sim.metrics.policy_metrics`` and
``KVStorage.metrics`` read it (docs/metrics.md defines every figure they make of it).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from .rejection import Rejection


@dataclass(slots=True)
class ReplayCounters:
    """One replay's tallies (tokens, requests, events) and records (TTFTs, rejections, the livelock).

    Attributes:
        requests: requests in the workload (``requests_total``).
        finished: requests done (last prefill chunk, or last decode step with colocated decode).
        prefill_tokens: extend tokens computed, a rejected request's included.
        cache_hit_tokens: prompt tokens matched in the prefix cache at admission (device + loaded back).
        owner_lane_exhausted: times a request got no chunk or decode slot because its lane had no page.
        last_short_lane: the lane of the last such time, -1 before any (``livelock``'s ``lane``).
        logits_budget_cuts: chunks the logits budget cut shorter or deferred.
        logits_peak: the largest MQA-logits estimate of a prefill step on one rank, elements.
        retractions: decoding requests retracted.
        ttft_ms: float64 ms (``array('d')``, 8 bytes a request: a day-scale replay keeps no objects), the TTFT
            of each request that got its first token, in that order.
        rejections: request id -> its ``Rejection``, in rejection order.
        livelock: ``livelock_finding``'s dict when the replay stopped on a livelock, else None.

    Example: ``ReplayCounters(requests=3)`` starts every count at 0 and ``last_short_lane`` at -1.
    """

    requests: int
    finished: int = 0
    prefill_tokens: int = 0
    cache_hit_tokens: int = 0
    owner_lane_exhausted: int = 0
    last_short_lane: int = -1
    logits_budget_cuts: int = 0
    logits_peak: int = 0
    retractions: int = 0
    ttft_ms: array[float] = field(default_factory=lambda: array("d"))
    rejections: dict[int, Rejection] = field(default_factory=dict)
    livelock: dict | None = None
