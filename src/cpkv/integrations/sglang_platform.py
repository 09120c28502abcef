"""SGLang platform plugin: owner-lane paged allocation with no code (docs/sglang.md, "Platform plugin").

cpkv registers ``activate`` under SGLang's entry-point group ``sglang.srt.platforms`` with the name
``cpkv`` (pyproject.toml). SGLang 0.5.23 (``sglang/srt/platforms/__init__.py``, ``_resolve_platform``)
loads it when ``SGLANG_PLATFORM=cpkv``; its ``get_paged_allocator_cls()`` then returns
``OwnerLaneTokenToKVPoolAllocator`` bound to the group the environment names:

- ``CPKV_CP_SIZE``: ranks in the CP group (required, an integer >= 1);
- ``CPKV_OWNER_POLICY``: ``balanced`` (default), ``rotation`` or ``legacy`` (C-PHASE).

``get_kv_pool_cls(kind)`` returns SGLang's MHA / MLA / DSA pool with cpkv's owner-lane write door
(``sglang_kv_rows``), and ``apply_server_args_defaults`` refuses the launch flags cpkv cannot serve
(``sglang_checks``); selected, ``activate`` also checks the SGLang version. Every other hook is the in-tree
platform's: CUDA (``CudaSRTPlatform``) where torch sees a CUDA device, ROCm where it is a HIP build,
SGLang's CPU platform otherwise. Without ``SGLANG_PLATFORM=cpkv`` the plugin
declines (``activate`` returns None), so installing cpkv never changes an SGLang deployment on its own.
SGLang resolves its platform while its own modules are still importing, so this module imports only
``sglang.srt.platforms`` (loaded by then) at import, and the allocator on the first ``get_paged_allocator_cls``.
"""

from __future__ import annotations

import os
from functools import cache

import torch
from sglang.srt.platforms.cpu import CpuSRTPlatform
from sglang.srt.platforms.cuda import CudaSRTPlatform
from sglang.srt.platforms.rocm import RocmSRTPlatform

from ..config import CPConfig, check_cp_size
from ..errors import ConfigError
from .sglang_checks import check_server_args, check_sglang_version

PLATFORM_NAME = "cpkv"
"""The entry point's name: the value of ``SGLANG_PLATFORM`` that selects this plugin."""

CP_SIZE_ENV = "CPKV_CP_SIZE"


def activate() -> str | None:
    """SGLang's platform-plugin entry point: the qualified name of the platform class, or None.

    Returns the cpkv platform over CUDA, ROCm or CPU (module docstring) when ``SGLANG_PLATFORM`` is
    ``cpkv``, else None (SGLang's auto-discovery then keeps its own platform).

    Raises: ConfigError when selected under an SGLang other than ``sglang_checks.SGLANG_VERSION``.
    """
    if os.environ.get("SGLANG_PLATFORM", "") != PLATFORM_NAME:
        return None
    check_sglang_version()
    if torch.cuda.is_available():
        cls = OwnerLaneRocmPlatform if torch.version.hip else OwnerLaneCudaPlatform
    else:
        cls = OwnerLaneCpuPlatform
    return f"{__name__}.{cls.__name__}"


def group_from_env() -> tuple[int, str]:
    """``(cp_size, owner_policy)`` from ``CPKV_CP_SIZE`` and ``CPKV_OWNER_POLICY`` (balanced when unset).

    Raises:
        ConfigError: ``CPKV_CP_SIZE`` unset, not an integer or out of range, or an unknown policy; the
            message names the variable and its value.
    """
    raw = os.environ.get(CP_SIZE_ENV)
    if raw is None or not raw.strip():
        raise ConfigError(
            f"environment variable {CP_SIZE_ENV} is not set: set it to the ranks of the CP group "
            f"(e.g. {CP_SIZE_ENV}=8) to use SGLANG_PLATFORM={PLATFORM_NAME}"
        )
    try:
        cp_size = check_cp_size(int(raw.strip()))
    except ValueError as e:  # int() of a non-integer, or ConfigError (a ValueError) for a bad size
        why = str(e) if isinstance(e, ConfigError) else "not an integer"
        raise ConfigError(
            f"environment variable {CP_SIZE_ENV}={raw!r} is not a CP group size: {why}"
        ) from None
    return cp_size, CPConfig(cp_size, 1).owner_policy  # CPConfig reads and checks CPKV_OWNER_POLICY


@cache
def _allocator_cls(cp_size: int, owner_policy: str) -> type:
    """One bound allocator class per group, so every construction site gets the same class."""
    from .sglang import OwnerLaneTokenToKVPoolAllocator  # not at import: SGLang resolves its platform while
    # sglang.srt.utils is still importing, and the allocator module imports that

    return OwnerLaneTokenToKVPoolAllocator.for_group(cp_size, owner_policy)


@cache
def _pool_cls(kind: str, cp_size: int) -> type:
    """One bound pool class per kind and group (imported on first use, as the allocator)."""
    from .sglang_kv_rows import POOL_CLASSES

    return POOL_CLASSES[kind].for_group(cp_size)


class OwnerLaneAllocatorHook:
    """The platform hook cpkv overrides; ``cp_size`` and ``owner_policy`` are read from the environment
    when the platform is built (SGLang builds it once, on first use of ``current_platform``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cp_size, self.owner_policy = group_from_env()

    def apply_server_args_defaults(self, server_args) -> None:
        """Refuses what cpkv cannot serve, one line each (``sglang_checks.check_server_args``): an
        ``attn_cp_size`` other than ``CPKV_CP_SIZE``, ``--enable-kv-cache-sharding``, HiSparse at C > 1.
        Sets no default. Raises ConfigError."""
        super().apply_server_args_defaults(server_args)  # type: ignore[misc]  # the SGLang platform after this mixin
        check_server_args(server_args, self.cp_size)

    def get_paged_allocator_cls(self) -> type:
        """``OwnerLaneTokenToKVPoolAllocator`` bound to this group (SGLang passes the six base arguments)."""
        return _allocator_cls(self.cp_size, self.owner_policy)

    def get_kv_pool_cls(self, *, kind: str) -> type:
        """SGLang's KV pool class of ``kind`` (``mha``, ``mla``, ``dsa``) with cpkv's owner-lane write door,
        bound to this group: each rank writes its own tokens at ``write_slots`` (``sglang_kv_rows``)."""
        return _pool_cls(kind, self.cp_size)


class OwnerLaneCudaPlatform(OwnerLaneAllocatorHook, CudaSRTPlatform):
    """SGLang's CUDA platform with cpkv's owner-lane paged allocator."""


class OwnerLaneRocmPlatform(OwnerLaneAllocatorHook, RocmSRTPlatform):
    """SGLang's ROCm platform with cpkv's owner-lane paged allocator."""


class OwnerLaneCpuPlatform(OwnerLaneAllocatorHook, CpuSRTPlatform):
    """SGLang's CPU platform with cpkv's owner-lane paged allocator (tests, CPU engines)."""
