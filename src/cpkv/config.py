"""CP group configuration and owner policies (SPEC C-PHASE, C-BALANCED)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import limits
from .errors import ConfigError, CpkvError

OWNER_POLICIES = ("rotation", "legacy", "balanced")
"""Owner policies: ``balanced`` (default, C-BALANCED), ``rotation`` (the seed rule, C-PHASE), ``legacy``
(phase 0, escape hatch)."""

DEFAULT_OWNER_POLICY = "balanced"

OWNER_POLICY_ENV = "CPKV_OWNER_POLICY"


INT64_MAX = 2**63 - 1
"""Largest value ``check_int`` accepts by default: every checked int fits the int64 arrays it sizes or
indexes (a larger one would overflow numpy with a bare ``OverflowError``)."""


def check_int(
    name: str, value: object, minimum: int, maximum: int | None = INT64_MAX, error: type[CpkvError] = ConfigError
) -> int:
    """Return ``value`` as an ``int`` when it is an integer in ``[minimum, maximum]``, else raise ``error``.

    Accepts Python and numpy integers; rejects ``bool``, floats and strings, naming ``name`` and the value.
    ``maximum`` defaults to ``INT64_MAX`` (the int64 range); ``None`` leaves the value unbounded (a seed,
    which sizes nothing). ``error`` is the typed error raised (default ``ConfigError``).
    """
    value = _as_int(name, value, error)
    if value < minimum:
        raise error(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        bound = f"{maximum} (the int64 maximum)" if maximum == INT64_MAX else f"{maximum}"
        raise error(f"{name} must be <= {bound}, got {value}")
    return value


def check_lane(name: str, value: object, cp_size: int, error: type[CpkvError] = ConfigError) -> int:
    """Return ``value`` as an ``int`` lane (or rank) in ``[0, cp_size)``, else raise ``error`` naming ``name``.

    A bool or non-integer is refused as such (``"rank must be an integer, got True"``), not as a lane out
    of range; an integer outside the lanes gives ``"rank=9 out of range [0, 8)"``.
    """
    if type(value) is int and 0 <= value < cp_size:  # the common case (an eviction per lane and step), at once
        return value
    lane = _as_int(name, value, error)
    if not 0 <= lane < cp_size:
        raise error(f"{name}={lane} out of range [0, {cp_size})")
    return lane


def _as_int(name: str, value: object, error: type[CpkvError]) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise error(f"{name} must be an integer, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def check_cp_size(value: object) -> int:
    """Return ``value`` as an ``int`` cp_size in ``[1, cpkv.limits.MAX_CP_SIZE]``, else raise ``ConfigError``
    naming the value (and the limit when it is above it). Every CP group of cpkv checks its cp_size here:
    ``CPConfig`` (so the planner, allocator, ``cpkv plan`` and ``cpkv run-dist``), ``SharedKVLayout``,
    ``HostTier`` and ``SimConfig``."""
    cp_size = check_int("cp_size", value, 1, None)
    if cp_size > limits.MAX_CP_SIZE:
        raise ConfigError(
            f"cp_size={cp_size} is above cpkv's limit of {limits.MAX_CP_SIZE} ranks (cpkv.limits.MAX_CP_SIZE)"
        )
    return cp_size


def per_lane_ints(name: str, value: object, cp_size: int, minimum: int) -> list[int]:
    """A per-lane capacity: one int for every lane, or a sequence of ``cp_size`` ints, each ``>= minimum``.

    Example ``per_lane_ints("pages_per_lane", 8, 4, 1) -> [8, 8, 8, 8]``. Raises ``ConfigError`` naming
    ``name`` (and the lane index) for a non-integer, a value below ``minimum`` or a wrong length.
    """
    if hasattr(value, "__index__") and not isinstance(value, bool):
        return [check_int(name, value, minimum)] * cp_size
    if not hasattr(value, "__iter__") or isinstance(value, (str, bytes)):
        raise ConfigError(f"{name} must be an integer or a sequence of {cp_size} integers, got {value!r}")
    caps = [check_int(f"{name}[{r}]", q, minimum) for r, q in enumerate(value)]  # type: ignore[arg-type]
    if len(caps) != cp_size:
        raise ConfigError(f"{name} has {len(caps)} entries, cp_size={cp_size} needs {cp_size}")
    return caps


@dataclass(frozen=True)
class CPConfig:
    """One context-parallel group's planning configuration (SPEC sections 2 and 4, C-PHASE).

    Attributes:
        cp_size: ranks in the CP group (C), an int in ``[1, cpkv.limits.MAX_CP_SIZE]`` (4096): a plan keeps
            per-rank tables, so a larger group would spend seconds and gigabytes on a few tokens.
        page_size: tokens per KV page (P), an int >= 1.
        owner_policy: ``"balanced"`` (the allocator picks each request's phase so the tightest lane
            stays freest, C-BALANCED; the planner alone, without allocator state, uses rotation),
            ``"rotation"`` (phase = (prefix pages + req_index) % C, C-PHASE) or ``"legacy"`` (phase 0).
            ``None`` reads ``CPKV_OWNER_POLICY`` once, here, defaulting to ``"balanced"``; after
            construction the field always holds the resolved policy.

    Raises:
        ConfigError: ``cp_size < 1`` or above ``MAX_CP_SIZE``, ``page_size < 1`` or above the int64
            range, a non-integer size, or an unknown policy (the
            message names ``owner_policy`` or the ``CPKV_OWNER_POLICY`` variable and the bad value).
    """

    cp_size: int
    page_size: int
    owner_policy: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cp_size", check_cp_size(self.cp_size))
        object.__setattr__(self, "page_size", check_int("page_size", self.page_size, 1))
        if self.owner_policy is None:
            raw = os.environ.get(OWNER_POLICY_ENV, DEFAULT_OWNER_POLICY)
            policy = raw.strip().lower() or DEFAULT_OWNER_POLICY
            source = f"environment variable {OWNER_POLICY_ENV}"
        else:
            raw = policy = self.owner_policy
            source = "owner_policy"
        if policy not in OWNER_POLICIES:
            raise ConfigError(f"{source}={raw!r} is not an owner policy; use one of {', '.join(OWNER_POLICIES)}")
        object.__setattr__(self, "owner_policy", policy)
