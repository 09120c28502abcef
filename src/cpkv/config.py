"""CP group configuration: owner policies and CP strategies (SPEC C-PHASE, C-BALANCED, C-INTERLEAVE).

The scalar checks every configuration uses (``check_int``, ``check_lane``, ``check_cp_size``,
``per_lane_ints``, ``INT64_MAX``) live in ``validate.py`` and are named here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ConfigError
from .validate import INT64_MAX, check_cp_size, check_int, check_lane, per_lane_ints

__all__ = [
    "BALANCED",
    "CP_STRATEGIES",
    "CP_STRATEGY_ENV",
    "DEFAULT_CP_STRATEGY",
    "DEFAULT_OWNER_POLICY",
    "DEFAULT_PAGE_SIZE",
    "INT64_MAX",
    "INTERLEAVE",
    "LEGACY",
    "OWNER_POLICIES",
    "OWNER_POLICY_ENV",
    "ROTATION",
    "ZIGZAG",
    "CPConfig",
    "check_cp_size",
    "check_int",
    "check_lane",
    "per_lane_ints",
]

ROTATION, LEGACY, BALANCED = "rotation", "legacy", "balanced"
"""The owner policies by name (``CPConfig.owner_policy`` holds one of them; ``policy.py`` has their rules)."""

OWNER_POLICIES = (ROTATION, LEGACY, BALANCED)
"""Owner policies: ``balanced`` (default, C-BALANCED), ``rotation`` (the seed rule, C-PHASE), ``legacy``
(phase 0, escape hatch)."""

DEFAULT_OWNER_POLICY = BALANCED

OWNER_POLICY_ENV = "CPKV_OWNER_POLICY"

ZIGZAG, INTERLEAVE = "zigzag", "interleave"
"""The CP strategies by name (``CPConfig.cp_strategy`` holds one): how a request's new pages go to lanes."""

CP_STRATEGIES = (ZIGZAG, INTERLEAVE)
"""CP strategies: ``zigzag`` (default, C-ZIGZAG: 2C contiguous segments) and ``interleave`` (C-INTERLEAVE: new
page k on lane ``(phase + k) % C``, SGLang's round-robin split)."""

DEFAULT_CP_STRATEGY = ZIGZAG

CP_STRATEGY_ENV = "CPKV_CP_STRATEGY"

DEFAULT_PAGE_SIZE = 64
"""Tokens per KV page (P) where none is given: ``cpkv plan``, ``simulate`` and ``run-dist``, ``SimConfig``,
``DistCase`` and the built-in workloads all default to it."""


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
        cp_strategy: ``"zigzag"`` (new pages in 2C contiguous segments, C-ZIGZAG) or ``"interleave"`` (new
            page k on lane ``(phase + k) % C``, C-INTERLEAVE). ``None`` reads ``CPKV_CP_STRATEGY`` once, here,
            defaulting to ``"zigzag"``; after construction the field holds the resolved strategy.

    Raises:
        ConfigError: ``cp_size < 1`` or above ``MAX_CP_SIZE``, ``page_size < 1`` or above the int64
            range, a non-integer size, an unknown policy or strategy (the message names ``owner_policy``,
            ``cp_strategy`` or the ``CPKV_OWNER_POLICY`` / ``CPKV_CP_STRATEGY`` variable and the bad value).
    """

    cp_size: int
    page_size: int
    owner_policy: str = None  # type: ignore[assignment]  # None: resolved to a policy in __post_init__
    cp_strategy: str = None  # type: ignore[assignment]  # None: resolved to a strategy in __post_init__

    if TYPE_CHECKING:  # the constructor takes None for either name; the fields always hold a str

        def __init__(
            self,
            cp_size: int,
            page_size: int,
            owner_policy: str | None = None,
            cp_strategy: str | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "cp_size", check_cp_size(self.cp_size))
        object.__setattr__(self, "page_size", check_int("page_size", self.page_size, 1))
        object.__setattr__(
            self,
            "owner_policy",
            _resolve(
                self.owner_policy,
                "owner_policy",
                OWNER_POLICY_ENV,
                DEFAULT_OWNER_POLICY,
                OWNER_POLICIES,
                "an owner policy",
            ),
        )
        object.__setattr__(
            self,
            "cp_strategy",
            _resolve(
                self.cp_strategy,
                "cp_strategy",
                CP_STRATEGY_ENV,
                DEFAULT_CP_STRATEGY,
                CP_STRATEGIES,
                "a CP strategy",
            ),
        )


def _resolve(value: object, field: str, env: str, default: str, allowed: tuple[str, ...], what: str) -> str:
    """``value``, or when None the environment variable ``env`` (stripped, lower-cased; unset or empty:
    ``default``), checked against ``allowed``; ConfigError naming ``field`` or ``env`` and the bad value."""
    raw: object
    out: object
    if value is None:
        raw = os.environ.get(env, default)
        out = raw.strip().lower() or default
        source = f"environment variable {env}"
    else:
        raw = out = value
        source = field
    if not isinstance(out, str) or out not in allowed:
        raise ConfigError(f"{source}={raw!r} is not {what}; use one of {', '.join(allowed)}")
    return out
