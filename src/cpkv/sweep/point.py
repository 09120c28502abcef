"""One point of a sweep: its ``cpkv simulate`` options, the ``SimConfig`` they make (through the same
function as ``cpkv simulate``), the key that names its result, and its replay.

The key is the SHA-256 of everything that decides the result: the cpkv version, the digest of the
workload's requests, the whole ``SimConfig`` (its ``cp_strategy`` too), the KV storage design and (owner-lane) the policy, the groups
and routing, and the cost model's
provenance (for the measured model: GPU, model, engine, versions and the digest of the sampled tables).
Two points with one key are one replay.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import time
from dataclasses import dataclass, field, replace

import msgspec
import numpy as np

from ..sim.config import SimConfig
from ..sim.settings import SELECTOR, by_key, defaults
from ..sim.storage import OWNER_LANE
from .groups import combine, split

CPKV_VERSION = importlib.metadata.version("cpkv")
"""The installed cpkv's version: part of every key, and checked against each worker's (a Ray cluster's
nodes must run the driver's cpkv)."""


@dataclass(frozen=True)
class PointTask:
    """What a worker needs to replay one point (picklable; the workload travels separately, once).

    Attributes: ``key`` (hex, ``point_key``), ``workload`` (the digest naming the ``WorkloadSpec`` in the
    dict shipped to every worker), ``config``, ``policy``, ``groups`` (>= 1), ``routing``, ``kv_storage`` (the
    design; its own placement but owner-lane's, where the policy places the pages).
    """

    key: str
    workload: str
    config: SimConfig
    policy: str
    groups: int
    routing: str
    kv_storage: str = OWNER_LANE


@dataclass(frozen=True)
class Shipment:
    """What every worker receives once, before any ``PointTask``: ``workloads`` (digest -> ``WorkloadSpec``)
    and ``price_tables`` (the measured tables the driver priced, ``(MeasuredSpec, cp_size)`` ->
    ``PriceTables``: a worker prices steps without sampling aiconfigurator again, about 2 s each)."""

    workloads: dict
    price_tables: dict = field(default_factory=dict)

    def unpack(self) -> dict:
        """In the worker: install the price tables (``cost.aic.install_tables``); return the workloads."""
        if self.price_tables:
            from ..cost.aic import install_tables

            install_tables(self.price_tables)
        return self.workloads


def simulate_options(workload: dict, values: dict[str, object]) -> dict:
    """``cpkv simulate``'s settings by name for one point: every setting's default (``sim.settings.defaults``),
    the grid's ``workload`` options, then the point's ``values`` (grid key -> converted value; a selector is
    one value a point: ``policy`` becomes ``policies = (policy,)``, ``kv_storage`` ``(design,)``,
    ``cp_strategy`` ``cp_strategies = (strategy,)``; the sweep's own keys are left out)."""
    options = defaults()
    options.update(workload)
    table = by_key()
    for key, value in values.items():
        if key in table:
            setting = table[key]
            options[setting.name] = (value,) if setting.group == SELECTOR else value
    return options


def workload_digest(requests) -> str:
    """SHA-256 (hex, 24 digits) of the requests' canonical JSON (``msgspec``: every field, arrival order)."""
    return hashlib.sha256(msgspec.json.encode(list(requests))).hexdigest()[:24]


def point_key(
    digest: str,
    config: SimConfig,
    policy: str,
    groups: int,
    routing: str,
    provenance: dict,
    kv_storage: str = OWNER_LANE,
) -> str:
    """The key of a point's result (hex, 24 digits): see the module docstring. ``routing`` counts only
    when ``groups > 1`` (one group routes nothing), ``policy`` only under owner-lane (the other designs
    place pages their own way: one replay whatever the policy)."""
    payload = {
        "cpkv": CPKV_VERSION,
        "workload": digest,
        "config": config.to_dict(),
        "kv_storage": kv_storage,
        "policy": policy if kv_storage == OWNER_LANE else None,
        "groups": groups,
        "routing": routing if groups > 1 else None,
        "cost": provenance,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def run_task(task: PointTask, workloads: dict) -> dict:
    """Replay ``task`` on ``workloads[task.workload]``: each group's requests (``groups.split``) through
    ``cpkv simulate``'s replay (``sim.replay.replay``, one policy, no output files), combined
    (``groups.combine``).

    Returns ``{"key", "status": "ok" | "failed", "error" (one line or None), "metrics" (or None),
    "per_group" (requests and TTFT p99 of each group), "wall_s", "cpkv_version"}``. An exception of the
    replay is the point's one-line error, never raised; KeyboardInterrupt is raised.
    """
    from ..sim.replay import replay

    t0 = time.perf_counter()
    out: dict[str, object] = {
        "key": task.key,
        "status": "ok",
        "error": None,
        "metrics": None,
        "per_group": None,
        "cpkv_version": CPKV_VERSION,
    }
    try:
        spec = workloads[task.workload]
        metrics: list[dict] = []
        ttft: list[np.ndarray] = []
        for g, requests in enumerate(split(spec.requests, task.groups, task.routing)):
            part = (
                spec
                if task.groups == 1
                else replace(
                    spec, requests=requests, description=f"{spec.description}, group {g + 1} of {task.groups}"
                )
            )
            result = replay(
                task.config, part, [task.policy], kv_storage=[task.kv_storage], progress=False, table=False
            ).results[0]
            assert result.ttft_ms is not None  # the engine records every replay's TTFTs
            metrics.append(result.metrics)
            ttft.append(result.ttft_ms)
        out["metrics"] = combine(metrics, ttft)
        out["per_group"] = [
            {
                "requests_total": m["requests_total"],
                "requests_finished": m["requests_finished"],
                "ttft_ms_p99": m["ttft_ms_p99"],
            }
            for m in metrics
        ]
    except Exception as e:  # a bad combination: the point's result, not the sweep's end
        out["status"], out["error"] = "failed", one_line(e)
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    return out


def one_line(e: BaseException) -> str:
    """``"TypeName: message"`` on one line (whitespace runs collapsed)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
