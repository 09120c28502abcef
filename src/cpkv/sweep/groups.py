"""A deployment of N CP groups: the workload split over the groups, each group replayed on its own, and
the groups' metrics combined into the point's (docs/sweep.md, "Groups").

``cpkv simulate`` replays one CP group; a capacity planner asks how many groups a target needs. A point
with ``groups = N`` routes every request to one group (``split``), replays each group's requests through
``cpkv simulate``'s replay with the same ``SimConfig`` and policy, and combines the N reports by the rule
of each metric (``RULES``): counts add up, TTFT percentiles are of every finished request of every group
(pooled), ratios and peaks are the worst group's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ..sim.metrics import (
    ANY,
    COUNTS,
    LANES_MAX,
    LANES_SUM,
    MAX,
    MERGED,
    METRICS,
    PER_GROUP,
    SAME,
    SUM,
    percentile_ms,
)

ROUTINGS = ("round-robin", "prefix")
"""``round-robin``: request i (in arrival order) goes to group ``i % N``. ``prefix``: by a hash of the
prompt's first ``PREFIX_ROUTE_BLOCKS`` block ids, so requests that share them (the turns of one
conversation) meet in one group's prefix cache."""

PREFIX_ROUTE_BLOCKS = 2
"""Block ids (512 tokens each) the ``prefix`` routing hashes: in the Mooncake trace every prompt starts
with the same block (a shared system prompt), so one block would send every request to one group; the
second block tells conversations apart (first 2,000 requests: 1,441 distinct first-two-block runs; at
N = 4 the groups get 461 to 528 requests)."""

RULES: dict[str, object] = {m.name: m.combine for m in METRICS}
"""How each metric of ``cpkv simulate``'s report combines over groups: ``sum``; ``max`` (the worst group;
None where every group has None); ``any``; ``same`` (one value for all); ``lanes-max`` / ``lanes-sum``
(per lane, over groups); ``("pooled", q)``: the q-th percentile of every group's requests' TTFTs, the
unfinished ones (``requests_unfinished``) counted as later than all (``sim.metrics.percentile_ms``: None
when it falls on one); ``("weighted", n)``: the mean weighted by metric ``n``; ``counts``: dicts of counts added;
``merged``: the dicts merged (request ids are the trace's, unique); ``per-group``: ``{group: value}`` of
the groups where it is not None; ``("ratio", a, b)``: ``sum a / (sum a + sum b)`` over the groups (the
hit rate: cache-hit tokens over hit + computed). A metric's rule is its ``combine`` in ``sim.metrics.METRICS``;
the report's keys without one fail the point (``combine``)."""


def split(requests: Sequence, groups: int, routing: str) -> list[tuple]:
    """The requests of each of ``groups`` groups, each in arrival order (``ROUTINGS`` says how).

    Returns ``groups`` tuples whose union is ``requests``; a group may be empty.
    Raises ValueError: an unknown ``routing`` or ``groups < 1``.
    """
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if routing == "round-robin":
        return [tuple(requests[g::groups]) for g in range(groups)]
    out: list[list] = [[] for _ in range(groups)]
    for r in requests:
        out[prefix_group(r.hash_ids, groups)].append(r)
    return [tuple(g) for g in out]


def prefix_group(hash_ids: Sequence[int], groups: int) -> int:
    """The ``prefix`` routing's group of a prompt: the first 8 bytes (little-endian) of the BLAKE2b digest
    of its first ``PREFIX_ROUTE_BLOCKS`` block ids, written as decimal ints joined by commas, mod
    ``groups``. Example: block ids ``(0, 9731, ...)`` hash the text ``"0,9731"``."""
    text = ",".join(str(int(b)) for b in hash_ids[:PREFIX_ROUTE_BLOCKS])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % groups


def combine(metrics: Sequence[dict], ttft_ms: Sequence[np.ndarray]) -> dict:
    """The point's metrics from each group's report (``metrics[g]``) and finished requests' TTFTs
    (``ttft_ms[g]`` float ``[finished]``), by ``RULES``. One group gives its report unchanged.

    Raises:
        ValueError: a metric without a rule in ``RULES`` (a metric added to the report must say how groups
            combine it).
    """
    if len(metrics) == 1:
        return dict(metrics[0])
    keys = list(dict.fromkeys(k for m in metrics for k in m))
    missing = [k for k in keys if k not in RULES]
    if missing:
        raise ValueError(f"no rule combines metric {missing[0]!r} over groups (cpkv.sweep.groups.RULES)")
    pooled = np.concatenate([np.asarray(t, dtype=np.float64) for t in ttft_ms])
    unfinished = sum(m.get("requests_unfinished") or 0 for m in metrics)
    out: dict = {}
    for key in keys:
        values = [m.get(key) for m in metrics]
        out[key] = _combine(RULES[key], values, metrics, pooled, unfinished)
    return out


def _combine(rule, values: list, metrics: Sequence[dict], pooled: np.ndarray, unfinished: int = 0):
    present = [v for v in values if v is not None]
    if rule == SUM:
        return sum(present)
    if rule == MAX:
        return max(present) if present else None
    if rule == ANY:
        return any(present)
    if rule == SAME:
        return present[0] if present else None
    if rule in (LANES_MAX, LANES_SUM):
        lanes = np.asarray(present)
        return (lanes.max(axis=0) if rule == LANES_MAX else lanes.sum(axis=0)).tolist()
    if isinstance(rule, tuple) and rule[0] == "ratio":
        a = sum(m.get(rule[1]) or 0 for m in metrics)
        b = sum(m.get(rule[2]) or 0 for m in metrics)
        return a / (a + b) if a + b else None
    if rule == COUNTS:
        total: dict = {}
        for d in present:
            for k, n in d.items():
                total[k] = total.get(k, 0) + n
        return dict(sorted(total.items()))
    if rule == MERGED:
        merged: dict = {}
        for d in present:
            merged.update(d)
        return dict(sorted(merged.items(), key=lambda kv: int(kv[0]))[:100])
    if rule == PER_GROUP:
        return {str(g): v for g, v in enumerate(values) if v is not None} or None
    kind, arg = rule
    if kind == "pooled":
        return percentile_ms(pooled.tolist(), arg, unfinished)
    if all(v is None for v in values):
        return None
    weights = [m.get(arg) or 0 for m in metrics]
    total_w = sum(weights)
    return (
        sum(w * (v or 0.0) for w, v in zip(weights, values, strict=True)) / total_w if total_w else values[0]
    )
