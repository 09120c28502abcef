"""The memory limit checked before allocating arrays whose size a user-given length sets (SPEC C-FAIL-FAST).

Every place where an input sizes arrays (``extend_len`` and ``cp_size`` for a plan and its
``out_cache_loc``, ``pages_per_lane`` for the allocator, a trace's request lengths for the simulator, the
KV buffer shape of ``cpkv run-dist``) first computes the bytes it would need, from the lengths alone,
and raises a typed error naming them when they exceed ``MAX_ARRAY_BYTES``. So ``cpkv plan --extend-len
100000000000`` fails at once instead of building a 12.5 GB array before the next one (745 GiB) fails,
or, on a smaller machine, being killed.

``MAX_CP_SIZE`` bounds the ranks of one CP group (``cp_size``), checked where every group is configured
(``cpkv.config.check_cp_size``: ``CPConfig``, ``SharedKVLayout``, ``HostTier``, ``SimConfig``): per-rank
tables grow with it, so ``cpkv plan --cp-size 10000000`` would take seconds and gigabytes for ten tokens.
"""

from __future__ import annotations

from .errors import CpkvError, PlanError

MAX_ARRAY_BYTES = 4 * 2**30
"""Most bytes (4 GiB) one plan with its allocation, one allocator's page tables, one simulated request
or one KV buffer may need. A plan and its ``out_cache_loc`` keep 24 B per token, so this allows about
170M tokens in one batch (a 1M-token prompt needs 24 MiB)."""


MAX_CP_SIZE = 4096
"""Most ranks (``cp_size``) of one CP group: far above real groups (8 to 64 ranks), low enough that a plan's
per-rank tables stay small: ``cpkv plan --cp-size 4096 --prefix-len 0 --extend-len 64`` peaks at 38.9 MB RSS
in 0.28 s, against 34.7 MB at ``--cp-size 8`` (1.12x; measured 2026-12-05, benchmarks/README.md), as no table
larger than O(cp_size) is kept per cp_size."""


def check_bytes(what: str, nbytes: int, error: type[CpkvError] = PlanError, hint: str = "") -> None:
    """Raise ``error`` naming ``what`` and ``nbytes`` when ``nbytes > MAX_ARRAY_BYTES``; else nothing.

    Args:
        what: what would be allocated, e.g. ``"a plan of 100,000,000,000 tokens and 1,562,500,000 pages"``.
        nbytes: bytes it would need (an int, computed without allocating).
        error: the typed error to raise (a ``CpkvError`` subclass; default ``PlanError``).
        hint: an optional sentence on how to stay below the limit.
    """
    if nbytes > MAX_ARRAY_BYTES:
        raise error(
            f"{what} would need {nbytes:,} bytes ({nbytes / 2**30:,.1f} GiB) of arrays, above cpkv's limit of "
            f"{MAX_ARRAY_BYTES:,} bytes (cpkv.limits.MAX_ARRAY_BYTES)" + (f"; {hint}" if hint else "")
        )
