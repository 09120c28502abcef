"""The grid file of ``cpkv sweep`` (docs/sweep.md): a workload, lists of ``cpkv simulate`` settings,
``[[exclude]]`` rules and a ``target``, expanded into points (one simulation each).

The grid's keys are ``cpkv simulate``'s settings, taken from their table (``sim.settings.SETTINGS``, by
``Setting.key``: ``--cp-size`` is ``cp_size``, ``--policy`` is ``policy``), plus the two the sweep adds
(``SWEEP_KEYS``: ``groups``, ``routing``). Each value is converted by the setting's own kind and parse
(``Setting.convert``), exactly as the flag would be, so a setting added to the table is a grid key.
"""

from __future__ import annotations

import itertools
import operator
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ..config import CP_STRATEGIES, OWNER_POLICIES
from ..errors import InputError
from ..sim.config import KV_STORAGE_DESIGNS
from ..sim.settings import WORKLOAD, WORKLOAD_OPTIONS, Setting, by_key
from .columns import TARGET_METRICS
from .groups import ROUTINGS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SWEEP_KEYS = {
    "groups": 'CP groups that share the workload (C x groups GPUs); default 1; "search" or {search = [lo, hi]}: '
    "the fewest groups that meet the target, by bisection (sweep/search.py)",
    "routing": f"how requests go to the groups: {' | '.join(ROUTINGS)}; default {ROUTINGS[0]}",
}
"""Grid keys of the sweep itself (not ``cpkv simulate`` settings), with what they mean."""

MAX_POINTS = 100_000
"""Most points a grid may expand to (the product of its lists' lengths, before ``[[exclude]]``) unless
``cpkv sweep --max-points`` raises it: counted before any point is built (a point costs a replay)."""

SEARCH_BOUNDS = (1, 64)
"""The groups ``groups = "search"`` tries, both included (``groups = {search = [lo, hi]}`` names others)."""

TOP_LEVEL = ("target", "workload", "grid", "exclude")
"""The grid file's top-level keys and tables."""

_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}
_CONDITION = re.compile(
    r"^\s*([a-z][a-z0-9_]*)\s*(<=|>=|==|<|>)\s*([-+]?[0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*$"
)


class GridError(InputError):
    """A grid file that cannot be swept: unreadable, not TOML, an unknown key, a value the setting
    refuses, an empty list, a bad target or exclude rule (``cpkv sweep`` exits 2 with this one line)."""


@dataclass(frozen=True)
class Target:
    """``metric op number`` conditions, all of which a point must meet (``target = "ttft_ms_p99 <= 2000"``
    or a list of such strings); ``text`` as written, joined by `` and ``."""

    conditions: tuple[tuple[str, str, float], ...]

    @property
    def text(self) -> str:
        return " and ".join(f"{m} {op} {v:g}" for m, op, v in self.conditions)

    def holds(self, row: dict) -> bool:
        """Whether ``row`` (a results row: metrics and ``gpus``) meets every condition; a missing (None)
        metric meets none."""
        return all(row.get(m) is not None and _OPS[op](row[m], v) for m, op, v in self.conditions)


@dataclass(frozen=True)
class Grid:
    """A parsed grid.

    Attributes:
        path: the grid file. text: its contents.
        workload: ``cpkv simulate``'s workload options by parameter name (``trace`` resolved against the
            grid file's directory, ``workload``, ``max_requests``; None where not given).
        axes: grid key -> its values (converted; a scalar in the file is one value), in file order.
        given: grid key -> its values as written (for the tables), same order.
        excludes: each ``[[exclude]]`` rule as grid key -> converted values it matches.
        target: the ``Target``, or None.
        search: ``(lo, hi)`` groups to search for the fewest that meet the target (``groups = "search"``;
            ``points`` then holds no ``groups``: the search picks them), or None.
    """

    path: Path
    text: str
    workload: dict
    axes: dict[str, tuple]
    given: dict[str, tuple]
    excludes: tuple[dict[str, tuple], ...]
    target: Target | None
    search: tuple[int, int] | None = None

    @property
    def varied(self) -> list[str]:
        """Grid keys with more than one value, in file order (``groups`` last under a search)."""
        return [k for k, v in self.axes.items() if len(v) > 1] + ["groups"] * (self.search is not None)

    def points(self) -> list[dict[str, tuple[object, object]]]:
        """Every combination of the axes not matched by an ``[[exclude]]`` rule that names only grid keys
        of the axes, in file order (the last key varies fastest): each ``{grid key: (converted value, value
        as written)}``. A rule naming a key the grid does not is matched later, against the value the
        replay uses (``excluded``)."""
        keys = list(self.axes)
        named = [rule for rule in self.excludes if rule.keys() <= self.axes.keys()]
        out = []
        for idx in itertools.product(*(range(len(self.axes[k])) for k in keys)):
            point = {k: (self.axes[k][i], self.given[k][i]) for k, i in zip(keys, idx, strict=True)}
            if not any(all(point[k][0] in vals for k, vals in rule.items()) for rule in named):
                out.append(point)
        return out

    def excluded(self, values: dict, used: dict) -> bool:
        """Whether a rule naming a key the grid does not name matches a point: ``values`` (grid key ->
        converted value) for the keys of the axes, ``used`` (grid key -> the value the replay uses, the
        results.csv column: the workload's or ``cpkv simulate``'s default) for the others."""
        for rule in self.excludes:
            if rule.keys() <= self.axes.keys():
                continue
            if all(_same(values[k] if k in self.axes else used.get(k), vals) for k, vals in rule.items()):
                return True
        return False


def _same(value: object, values: tuple) -> bool:
    """``value`` is one of ``values``, a list of per-lane pages comparing as a tuple."""
    norm = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
    return norm(value) in {norm(v) for v in values}


def read_grid(path: Path, max_points: int = MAX_POINTS) -> Grid:
    """Read and check the grid file ``path``; GridError (one line naming the file and key) otherwise, or
    naming the grid's size when its lists make more than ``max_points`` points (counted, not built)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GridError(f"cannot read grid {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise GridError(f"{path}: not a valid TOML file: {e}") from None
    where = f"{path}:"
    unknown = [k for k in doc if k not in TOP_LEVEL]
    if unknown:
        raise GridError(f"{where} unknown top-level key {unknown[0]!r}; a grid has {', '.join(TOP_LEVEL)}")
    workload = _workload(doc.get("workload", {}), Path(path).parent, where)
    grid = _table(doc.get("grid"), "[grid]", where)
    if not grid:
        raise GridError(
            f"{where} [grid] is missing or empty: give lists of settings to sweep, e.g. cp_size = [4, 8]"
        )
    axes, given = {}, {}
    search = _search(grid.pop("groups", None), where) if _is_search(grid.get("groups")) else None
    if search is not None and doc.get("target") is None:
        raise GridError(f'{where} groups = "search" needs a target: the fewest groups that meet what?')
    for key, raw in grid.items():
        values, converted = _values(key, raw, f"{where} [grid] {key}")
        if not values:
            raise GridError(f"{where} [grid] {key} is an empty list")
        dup = next((v for i, v in enumerate(converted) if v in converted[:i]), None)
        if dup is not None:
            raise GridError(f"{where} [grid] {key} lists {dup!r} twice")
        axes[key], given[key] = tuple(converted), tuple(values)
    if "policy" not in axes:  # as cpkv simulate: every policy
        axes["policy"] = given["policy"] = OWNER_POLICIES
    size = 1
    for axis in axes.values():
        size *= len(axis)
    if size > max_points:
        sizes = " x ".join(f"{len(v):,} {k}" for k, v in axes.items())
        raise GridError(
            f"{where} the grid has {size:,} points ({sizes}), above the limit of {max_points:,}: "
            "narrow it, or raise the limit with --max-points"
        )
    raw_rules = doc.get("exclude", [])
    if not isinstance(raw_rules, list) or not all(isinstance(r, dict) for r in raw_rules):
        raise GridError(f"{where} exclude must be [[exclude]] tables")
    excludes = []
    for n, rule in enumerate(raw_rules, 1):
        if not rule:
            raise GridError(f"{where} [[exclude]] #{n} is empty (it would exclude every point)")
        excludes.append({k: tuple(_values(k, rule[k], f"{where} [[exclude]] #{n} {k}")[1]) for k in rule})
    target = _target(doc.get("target"), where)
    if target and "ttft_slo_ms" not in axes and any(m == "slo_attainment" for m, _, _ in target.conditions):
        raise GridError(
            f"{where} target {target.text!r} needs ttft_slo_ms in [grid] (ms, as --ttft-slo-ms): "
            "without it slo_attainment is null and no point meets the target"
        )
    parsed = Grid(Path(path), text, workload, axes, given, tuple(excludes), target, search)
    if not parsed.points():
        raise GridError(f"{where} the [[exclude]] rules exclude every point of the grid")
    return parsed


def _is_search(raw: object) -> bool:
    return raw == "search" or (isinstance(raw, dict) and "search" in raw)


def _search(raw: object, where: str) -> tuple[int, int]:
    """``(lo, hi)`` of ``groups = "search"`` (``SEARCH_BOUNDS``) or ``groups = {search = [lo, hi]}``."""
    if raw == "search":
        return SEARCH_BOUNDS
    assert isinstance(raw, dict)  # _is_search: "search" or a table with a search key
    bounds = raw.get("search")
    if not (
        len(raw) == 1
        and isinstance(bounds, list)
        and len(bounds) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
        and 1 <= bounds[0] <= bounds[1]
    ):
        raise GridError(
            f'{where} [grid] groups: a search is "search" or {{search = [lo, hi]}} with 1 <= lo <= hi, '
            f"got {raw!r}"
        )
    return bounds[0], bounds[1]


def _values(key: str, raw: object, where: str) -> tuple[list, list]:
    """``(as written, converted)`` values of ``key`` (a TOML scalar is one value); ``policy = "all"`` is
    every policy, ``kv_storage = "all"`` every design and ``cp_strategy = "all"`` every CP strategy, as for
    ``--policy``, ``--kv-storage`` and ``--cp-strategy``."""
    written = raw if isinstance(raw, list) else [raw]
    every = {"policy": OWNER_POLICIES, "kv_storage": KV_STORAGE_DESIGNS, "cp_strategy": CP_STRATEGIES}
    pairs: list[tuple[object, object]] = []
    for value in written:
        c = convert(key, value, where)
        pairs += [(p, p) for p in every[key]] if key in every and c == "all" else [(value, c)]
    return [w for w, _ in pairs], [c for _, c in pairs]


def grid_keys() -> list[str]:
    """Every key ``[grid]`` and ``[[exclude]]`` accept: ``cpkv simulate``'s settings, then ``SWEEP_KEYS``."""
    return [k for k, s in by_key().items() if s.group != WORKLOAD] + list(SWEEP_KEYS)


def convert(key: str, value: object, where: str) -> object:
    """``value`` (from TOML) of grid key ``key`` as ``cpkv simulate`` would take it: the setting's kind and
    parse (``Setting.convert``: ``--pages-per-lane`` takes ``2048`` or ``"9,10,10,10"``; ``--policy`` one
    name or ``all``). TOML's own types must match the setting's: an integer setting refuses ``2.5`` and
    ``true``.

    Raises:
        GridError: an unknown key, a value of the wrong kind, or one the option refuses (naming ``where``).
    """
    if key == "groups":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GridError(f"{where}: groups must be an integer >= 1, got {value!r}")
        return value
    if key == "routing":
        if value not in ROUTINGS:
            raise GridError(f"{where}: routing must be one of {', '.join(ROUTINGS)}, got {value!r}")
        return value
    setting = by_key().get(key)
    if setting is None or setting.group == WORKLOAD:
        hint = "; name the workload in [workload]" if setting is not None else ""
        raise GridError(f"{where}: unknown setting {key!r}{hint}; the grid takes {', '.join(grid_keys())}")
    kinds: dict[type | None, Callable[[object], bool]] = {
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        bool: lambda v: isinstance(v, bool),
    }
    ok = kinds.get(
        setting.kind if setting.choices is None else None, lambda v: isinstance(v, str) or _is_int(v)
    )
    if not ok(value):
        raise GridError(
            f"{where}: {value!r} is not a valid {setting.type_name} for --{key.replace('_', '-')}"
        )
    try:
        return setting.convert(value)  # --policy, --kv-storage, --cp-strategy: one a point
    except InputError as e:
        raise GridError(f"{where}: {e}") from None


def _is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool (TOML's integers)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _workload(table: object, base: Path, where: str) -> dict:
    table = _table(table, "[workload]", where) or {}
    unknown = [k for k in table if k not in WORKLOAD_OPTIONS]
    if unknown:
        raise GridError(f"{where} [workload] takes {', '.join(WORKLOAD_OPTIONS)}, not {unknown[0]!r}")
    if "trace" in table and "workload" in table:
        raise GridError(f"{where} [workload] give trace or workload, not both")
    settings = by_key()
    out: dict[str, object] = {}
    for key in WORKLOAD_OPTIONS:
        value = table.get(key)
        if value is None:
            out[key] = None
        elif key == "trace":
            if not isinstance(value, str) or not value:
                raise GridError(f"{where} [workload] trace must be a file path, got {value!r}")
            out[key] = (
                base / Path(value).expanduser() if not Path(value).expanduser().is_absolute() else Path(value)
            )
        else:
            out[key] = _workload_value(settings[key], value, f"{where} [workload] {key}")
    return out


def _workload_value(setting: Setting, value: object, where: str) -> object:
    if setting.kind is int:
        if not _is_int(value) or value < 1:  # type: ignore[operator]
            raise GridError(f"{where}: must be an integer >= 1, got {value!r}")
        return value
    try:
        return setting.convert(value)
    except InputError as e:
        raise GridError(f"{where}: {e}") from None


def _table(value: object, name: str, where: str) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise GridError(f"{where} {name} must be a table")
    return value


def _target(value: object, where: str) -> Target | None:
    if value is None:
        return None
    texts = value if isinstance(value, list) else [value]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise GridError(f'{where} target must be a string like "ttft_ms_p99 <= 2000" or a list of them')
    conditions = []
    for text in texts:
        m = _CONDITION.match(cast(str, text))  # every text is a str (checked above)
        if not m:
            raise GridError(f"{where} target {text!r} is not 'metric op number' (op: {', '.join(_OPS)})")
        metric, op, number = m.groups()
        if metric not in TARGET_METRICS:
            raise GridError(
                f"{where} target {text!r}: {metric!r} is not a numeric metric; use one of "
                f"{', '.join(TARGET_METRICS)}"
            )
        conditions.append((metric, op, float(number.replace("_", ""))))
    return Target(tuple(conditions))
