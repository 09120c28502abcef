"""Configurations cpkv refuses in SGLang, each as one line naming the value (docs/sglang.md, "Launch").

cpkv's SGLang plugins (``sglang_platform``, ``sglang_hooks``) call these at start-up, so a server that
cannot run cpkv's owner lanes stops before it serves:

- an SGLang other than ``SGLANG_VERSION``: the hooks name 0.5.23's functions and fields;
- ``CPKV_CP_SIZE`` other than SGLang's attention CP size (``--attn-cp-size``);
- ``--enable-kv-cache-sharding`` with cpkv: SGLang's own page sharding would own the same KV layout;
- at ``cp_size > 1``, an allocator SGLang builds without cpkv's platform hook: SWA models, HiSparse,
  ``--page-size 1`` (SGLang's token allocator).

``selected()`` says whether ``SGLANG_PLATFORM`` selects cpkv: the hooks of ``sglang_hooks`` and
``sglang_hicache`` read it at every call. Imports no sglang at module level (the platform plugin loads it
while SGLang's modules import).
"""

from __future__ import annotations

import os
from typing import SupportsInt

from ..errors import ConfigError

PLATFORM_NAME = "cpkv"
"""The value of ``SGLANG_PLATFORM`` that selects cpkv's plugins (both entry points' name)."""


def selected() -> bool:
    """Whether ``SGLANG_PLATFORM`` selects cpkv (read at every call); every cpkv hook passes through
    otherwise."""
    return os.environ.get("SGLANG_PLATFORM", "") == PLATFORM_NAME


SGLANG_VERSION = "0.5.23"
"""The SGLang release cpkv's hooks are written against (the pin of tests/integration/sglang/requirements.txt)."""


def installed_sglang_version() -> str:
    """``sglang.version.__version__`` of the SGLang this process imports (set before ``sglang`` itself has
    finished importing, when SGLang resolves its platform)."""
    from sglang import version

    return str(version.__version__)


def check_sglang_version(version: str | None = None) -> str:
    """``version`` (default: the imported SGLang's) when it is ``SGLANG_VERSION``.

    Raises:
        ConfigError: any other version, named in the message.
    """
    version = installed_sglang_version() if version is None else version
    if version != SGLANG_VERSION:
        raise ConfigError(
            f"SGLang {version} is installed but cpkv's SGLang plugin is pinned to {SGLANG_VERSION} "
            f"(its hooks name that release's functions): install sglang=={SGLANG_VERSION} or unset "
            "SGLANG_PLATFORM"
        )
    return version


def check_cp_size_matches(cp_size: int, attn_cp_size: SupportsInt | None) -> None:
    """ConfigError unless SGLang's attention CP size equals cpkv's ``CPKV_CP_SIZE`` (``cp_size``)."""
    if attn_cp_size is not None and int(attn_cp_size) != cp_size:
        raise ConfigError(
            f"CPKV_CP_SIZE={cp_size} but SGLang's attention CP size is attn_cp_size={attn_cp_size}: "
            "set CPKV_CP_SIZE to the --attn-cp-size SGLang runs"
        )


def check_server_args(server_args, cp_size: int) -> None:
    """The launch flags cpkv refuses, read from SGLang's ``ServerArgs`` (or any object with its field names:
    ``attn_cp_size``, ``enable_kv_cache_sharding``, ``enable_hisparse``).

    Raises:
        ConfigError: ``attn_cp_size`` other than ``cp_size``; ``--enable-kv-cache-sharding``; HiSparse at
            ``cp_size > 1``. One line, naming the value.
    """
    check_cp_size_matches(cp_size, getattr(server_args, "attn_cp_size", None))
    if getattr(server_args, "enable_kv_cache_sharding", False):
        raise ConfigError(
            "--enable-kv-cache-sharding (enable_kv_cache_sharding=True) is set with SGLANG_PLATFORM=cpkv: "
            "SGLang's own page sharding and cpkv's owner lanes cannot both own the KV layout; drop the flag"
        )
    if cp_size > 1 and getattr(server_args, "enable_hisparse", False):
        raise ConfigError(
            _not_served(
                "--enable-hisparse (enable_hisparse=True)", cp_size, "HiSparse builds its own allocator"
            )
        )


def check_scheduler_allocator(
    allocator, cp_size: int, *, is_hybrid_swa: bool, enable_hisparse: bool, page_size: int
) -> None:
    """At ``cp_size > 1`` the scheduler's allocator must be cpkv's (``OwnerLaneTokenToKVPoolAllocator``).

    Raises:
        ConfigError: SWA (``is_hybrid_swa``), HiSparse, ``page_size == 1`` or any other allocator SGLang built
            in place of cpkv's; the message names it.
    """
    from .sglang import OwnerLaneTokenToKVPoolAllocator

    if cp_size == 1 or isinstance(allocator, OwnerLaneTokenToKVPoolAllocator):
        return
    if is_hybrid_swa:
        raise ConfigError(
            _not_served(
                "a sliding-window (SWA) model (is_hybrid_swa=True)",
                cp_size,
                "SGLang's SWA allocator keeps its own pages",
            )
        )
    if enable_hisparse:
        raise ConfigError(
            _not_served(
                "--enable-hisparse (enable_hisparse=True)", cp_size, "HiSparse builds its own allocator"
            )
        )
    why = (
        "page_size=1 takes SGLang's token allocator: use --page-size > 1"
        if page_size == 1
        else "no platform hook"
    )
    raise ConfigError(
        _not_served(f"SGLang's {type(allocator).__name__} (page_size={page_size})", cp_size, why)
    )


def _not_served(what: str, cp_size: int, why: str) -> str:
    return (
        f"{what} at CPKV_CP_SIZE={cp_size}: cpkv's owner lanes serve full-attention paged pools only ({why}); "
        "run it without SGLANG_PLATFORM=cpkv"
    )
