"""CP group configuration and owner policies (SPEC C-PHASE, C-BALANCED).

The scalar checks every configuration uses (``check_int``, ``check_lane``, ``check_cp_size``,
``per_lane_ints``, ``INT64_MAX``) live in ``validate.py`` and are named here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import ConfigError
from .validate import INT64_MAX, check_cp_size, check_int, check_lane, per_lane_ints

__all__ = [
    "BALANCED", "DEFAULT_OWNER_POLICY", "INT64_MAX", "LEGACY", "OWNER_POLICIES", "OWNER_POLICY_ENV", "ROTATION",
    "CPConfig", "check_cp_size", "check_int", "check_lane", "per_lane_ints",
]  # fmt: skip

ROTATION, LEGACY, BALANCED = "rotation", "legacy", "balanced"
"""The owner policies by name (``CPConfig.owner_policy`` holds one of them; ``policy.py`` has their rules)."""

OWNER_POLICIES = (ROTATION, LEGACY, BALANCED)
"""Owner policies: ``balanced`` (default, C-BALANCED), ``rotation`` (the seed rule, C-PHASE), ``legacy``
(phase 0, escape hatch)."""

DEFAULT_OWNER_POLICY = BALANCED

OWNER_POLICY_ENV = "CPKV_OWNER_POLICY"


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
