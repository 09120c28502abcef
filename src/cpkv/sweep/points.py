"""From a grid to the sweep's work, in the driver: each point's ``cpkv simulate`` options, its
``SimConfig`` (``sim.settings.config_of``, the function ``cpkv simulate`` calls), the cost model's
provenance and the key, and the workloads (each read or generated once).

A point whose settings do not make a config (a bad combination: per-lane pages for another ``cp_size``,
an EP width that does not divide it) is failed here with its one-line error and replays nothing. Points
of one key (one group under two routings; a KV storage design other than owner-lane under two owner
policies: the design places pages its own way) are one replay, a row each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..cost.spec import CostExtraMissing
from ..errors import CpkvError
from ..sim.config import SimConfig
from ..sim.settings import (
    COST,
    POLICY_OPTION,
    STORAGE_OPTION,
    STRATEGY_OPTION,
    WORKLOAD,
    WORKLOAD_OPTIONS,
    by_key,
    config_of,
    workload_of,
)
from ..sim.storage import OWNER_LANE
from .grid import Grid, GridError
from .groups import ROUTINGS
from .point import PointTask, one_line, point_key, simulate_options, workload_digest


@dataclass
class SweepPoints:
    """``rows``: one per point, in grid order (``point``, ``status`` None until known, ``error``, the config
    columns, ``gpus``; private ``_settings`` as written, ``_config``, ``_sim_config``, ``_provenance``,
    ``key``); ``tasks``: key -> ``PointTask`` (one per distinct key); ``workloads``: digest -> spec;
    ``config_columns``: the config column names, in order; ``provenances``: each cost model's;
    ``price_tables``: the measured tables the points use, by ``(MeasuredSpec, cp_size)`` (priced here once,
    shipped to the workers with the workloads)."""

    rows: list[dict]
    tasks: dict[str, PointTask]
    workloads: dict
    config_columns: list[str]
    provenances: list[dict] = field(default_factory=list)
    price_tables: dict = field(default_factory=dict)


def config_columns() -> list[str]:
    """The config columns of the results: ``cpkv simulate``'s settings (``sim.settings.SETTINGS`` by grid key,
    the workload's left out), then ``groups``, ``routing``, ``gpus``."""
    return [k for k, s in by_key().items() if s.group != WORKLOAD] + [
        "groups",
        "routing",
        "gpus",
    ]


def resolved(options: dict, config: SimConfig | None) -> dict:
    """A point's settings as the replay used them, by grid key: a ``SimConfig`` field from ``config``
    (``chunk_size`` the workload's when not given), the cost options from ``config.measured``
    (``ep_size``: the width used), ``policy``, ``kv_storage`` and ``cp_strategy`` (one a point), any other
    option as given. Without ``config`` (it failed),
    the options as given."""
    fields = {f.name for f in dataclasses.fields(SimConfig)}
    out = {}
    for key, setting in by_key().items():
        name = setting.name
        if setting.group == WORKLOAD:
            continue
        value = options[name]
        if name == STRATEGY_OPTION:
            value = config.cp_strategy if config is not None else value[0]
        elif name in (POLICY_OPTION, STORAGE_OPTION):
            value = value[0]
            if name == POLICY_OPTION and options[STORAGE_OPTION][0] != OWNER_LANE:
                value = None  # the other designs place pages their own way: one replay whatever the policy
        elif config is not None and name in fields:
            value = getattr(config, name)
        elif config is not None and setting.group == COST:
            m = config.measured
            if name == "cost_model":
                value = "illustrative" if m is None else "measured"
            elif m is None:
                value = None
            else:
                value = m.ep_for(config.cp_size) if name == "ep_size" else getattr(m, name)
        out[key] = value
    return out


def prepare_points(grid: Grid, points: list[dict] | None = None) -> SweepPoints:
    """Every point of ``grid`` (or the given ``points``, as ``Grid.points`` makes them: a search's chosen
    group counts) made ready to replay (see the module docstring).

    Raises:
        GridError: more groups than the workload has requests; ``[[exclude]]`` rules that exclude every point.
        CostExtraMissing: a point asks for the measured model and aiconfigurator is not installed (it would
            fail every such point: the sweep stops before any, exit 2).
        CpkvError: the workload cannot be read or generated (TraceError, ConfigError: exit 2).
    """
    from ..cost.coverage import check_covered
    from ..sim.cost import coverage, step_cost

    plan = SweepPoints([], {}, {}, config_columns())
    specs: dict[tuple, tuple] = {}  # workload identity -> (spec, digest)
    provenance_of: dict[tuple, dict] = {}
    index, kept = 0, set()  # points kept, the workloads they read
    for point in grid.points() if points is None else points:
        values: dict[str, Any] = {k: v for k, (v, _) in point.items()}  # grid key -> its converted value
        groups, routing = values.get("groups", 1), values.get("routing", ROUTINGS[0])
        options = simulate_options(grid.workload, values)
        ident = tuple(options[k] for k in WORKLOAD_OPTIONS)
        if options["trace"] is None:  # a generated workload depends on its seed (short prompts: page size)
            ident += (options["seed"], options["page_size"])
        if ident not in specs:
            spec = workload_of(options)
            if not isinstance(spec.requests, tuple):  # a streamed trace: held, as workers replay its groups
                spec = dataclasses.replace(spec, requests=tuple(spec.requests))
            specs[ident] = (spec, workload_digest(spec.requests))
            plan.workloads[specs[ident][1]] = spec
        spec, digest = specs[ident]
        if groups > len(spec.requests):  # before any split or replay: a group of no request is no CP group
            raise GridError(
                f"{grid.path}: groups = {groups:,} splits a workload of {len(spec.requests):,} requests: "
                f"{groups - len(spec.requests):,} groups would get none; at most one group per request"
            )
        row: dict[str, Any] = {
            "point": None,
            "status": None,
            "error": None,
            "key": None,
            "_settings": {k: g for k, (_, g) in point.items()},
            "_sim_config": None,
            "_provenance": None,
        }
        try:
            config, provenance = config_of(options, spec), None
        except CostExtraMissing:
            raise
        except CpkvError as e:
            config = None
            row.update(status="failed", error=one_line(e))
        row["_config"] = {**resolved(options, config), "groups": groups, "routing": routing}
        if grid.excluded(values, row["_config"]):  # a rule on a key the grid does not name: the value used
            continue
        index += 1
        row["point"] = index
        kept.add(digest)
        try:
            if config is not None:
                cost_id = (config.measured, config.cp_size, config.cost)
                if cost_id not in provenance_of:
                    if config.measured is not None:
                        check_covered(config.measured, config.cp_size)
                    cost = step_cost(config)
                    provenance_of[cost_id] = cost.provenance()
                    if config.measured is not None:
                        plan.price_tables[config.measured, config.cp_size] = cost.tables
                provenance = {
                    **provenance_of[cost_id],
                    **coverage(config, spec.requests),
                }  # what is extrapolated
        except CostExtraMissing:
            raise
        except CpkvError as e:
            config, provenance = None, None
            row.update(status="failed", error=one_line(e))
            row["_config"] = {**resolved(options, None), "groups": groups, "routing": routing}
        row.update(row["_config"])
        cp = row["cp_size"]
        row["gpus"] = cp * groups if isinstance(cp, int) else None
        if config is not None:
            assert provenance is not None  # priced above: a point whose cost failed has no config
            row["_sim_config"], row["_provenance"] = config.to_dict(), provenance
            row["_kv_tokens_per_gpu"] = sum(config.lane_capacities) / config.cp_size * config.page_size
            design = values.get("kv_storage", OWNER_LANE)
            key = row["key"] = point_key(
                digest, config, values["policy"], groups, routing, provenance, design
            )
            plan.tasks.setdefault(
                key, PointTask(key, digest, config, values["policy"], groups, routing, design)
            )
        plan.rows.append(row)
    if not plan.rows:
        raise GridError(f"{grid.path}: the [[exclude]] rules exclude every point of the grid")
    plan.workloads = {d: s for d, s in plan.workloads.items() if d in kept}  # none of excluded points only
    plan.provenances = list(provenance_of.values())
    return plan
