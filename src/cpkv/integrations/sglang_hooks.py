"""SGLang's general plugin: the scheduler and the PD transfer see cpkv's CP group, no SGLang file patched.

cpkv registers ``register`` under SGLang 0.5.23's entry-point group ``sglang.srt.plugins`` (name ``cpkv``,
pyproject.toml); SGLang runs it in every process before the ``Scheduler`` is built. With
``SGLANG_PLATFORM=cpkv`` it pins the SGLang version (``sglang_checks``) and registers ``HookRegistry``
hooks on the scheduler (``kv_shard_widening = C``), the invariant checker (free term
``aggregate_free_size()``), ``PrefillAdder`` (``per_req_token_overhead = C * P``), the PD transfer (every
CP rank a sender), ``prepare_cp_forward`` and ``floor_chunked_tokens`` (``sglang_cp_split``) and HiCache
(``sglang_hicache``); the table of targets: docs/sglang.md, "Launch: two plugins".

Raises ``SGLangStartError`` naming a hook that does not wrap its target. Every hook passes through when
``SGLANG_PLATFORM`` is not ``cpkv`` (``sglang_checks.selected``) or the allocator is not cpkv's. Imports no
sglang at import time.
"""

from __future__ import annotations

from ..errors import ConfigError
from .sglang_checks import PLATFORM_NAME, selected

__all__ = ["PLATFORM_NAME", "SGLangStartError", "hook_applied", "hooks", "register", "selected"]

_S = "sglang.srt."
TARGETS = {
    "widen_scheduler": _S + "managers.scheduler.Scheduler.init_running_status",
    "check_full_pool": _S
    + "managers.scheduler_components.invariant_checker.SchedulerInvariantChecker._check_full_pool",
    "prefill_adder_overhead": _S + "managers.schedule_policy.PrefillAdder.__init__",
    "pd_shard_by_cp_rank": _S + "disaggregation.common.conn.CommonKVManager.__init__",
    "pd_every_cp_rank_sends": _S + "disaggregation.common.conn.CommonKVManager.__init__",
}
"""Hook function name -> the dotted SGLang target it is registered on."""


class SGLangStartError(SystemExit):
    """SGLang cannot start with cpkv: exits the process with one line (``SystemExit``, so SGLang's plugin
    loader, which logs an ``Exception`` and goes on, lets it through)."""


def _cpkv_allocator(allocator):
    """``allocator`` when it is cpkv's ``OwnerLaneTokenToKVPoolAllocator`` and cpkv is selected, else None."""
    if not selected():
        return None
    from .sglang import OwnerLaneTokenToKVPoolAllocator

    return allocator if isinstance(allocator, OwnerLaneTokenToKVPoolAllocator) else None


def _group_cp_size() -> int:
    from .sglang_platform import group_from_env

    return group_from_env()[0]


# ----------------------------------------------------------------------------------------------- hooks
def widen_scheduler(self, *args, **kwargs) -> None:
    """BEFORE ``Scheduler.init_running_status`` (after the pools, before the pool-stats observer, the
    invariant checker and the load inquirer read ``kv_shard_widening``): ``kv_shard_widening = C``.

    Raises: ConfigError (one line) for an allocator other than cpkv's at C > 1 or a CP size mismatch.
    """
    if not selected():
        return
    from sglang.srt.runtime_context import get_parallel

    from .sglang_checks import check_cp_size_matches, check_scheduler_allocator

    cp_size = _group_cp_size()
    check_cp_size_matches(cp_size, get_parallel().attn_cp_size)
    allocator = self.token_to_kv_pool_allocator
    check_scheduler_allocator(
        allocator,
        cp_size,
        is_hybrid_swa=bool(self.is_hybrid_swa),
        enable_hisparse=bool(getattr(self, "enable_hisparse", False)),
        page_size=int(self.page_size),
    )
    if _cpkv_allocator(allocator) is not None:
        self.kv_shard_widening = allocator.cp_size


def check_full_pool(original, self, ps, *args, **kwargs):
    """AROUND ``SchedulerInvariantChecker._check_full_pool``: for cpkv's allocator the conservation check's
    free term is ``aggregate_free_size()`` (free pages of every lane), not ``available_size()``, the
    admission floor (C times the shortest lane)."""
    allocator = _cpkv_allocator(self.token_to_kv_pool_allocator)
    if allocator is not None:
        import dataclasses

        ps = dataclasses.replace(ps, full_available_size=allocator.aggregate_free_size())
    return original(self, ps, *args, **kwargs)


def prefill_adder_overhead(result, self, *args, **kwargs) -> None:
    """AFTER ``PrefillAdder.__init__``: ``per_req_token_overhead = C * P``, a page a lane per request (what
    cpkv's ``get_extend_allocation_demand`` assumes); SGLang's shard size stays 1 (no ``rotation_bases``)."""
    allocator = _cpkv_allocator(self.token_to_kv_pool_allocator)
    if allocator is not None:
        self.per_req_token_overhead = allocator.cp_size * allocator.page_size


def _mode(args, kwargs) -> str | None:
    """``CommonKVManager.__init__``'s ``disaggregation_mode`` (its second argument) as ``"prefill"`` / ``"decode"``."""
    mode = kwargs.get("disaggregation_mode", args[1] if len(args) > 1 else None)
    return getattr(mode, "value", mode)


def _is_prefill(args, kwargs) -> bool:
    return _mode(args, kwargs) == "prefill"


def pd_shard_by_cp_rank(self, *args, **kwargs) -> None:
    """BEFORE ``CommonKVManager.__init__`` on a PD prefill worker at C > 1: ``kv_shard_size = C`` and
    ``kv_shard_rank`` = this rank's attention-CP rank (its lane), without ``--enable-kv-cache-sharding``.
    ``__init__`` then makes every CP rank a sender and registers it, and ``_prepare_send_indices`` sends
    each rank its own pages through SGLang's ``filter_kv_indices_for_shard_rank``.

    Raises: ConfigError when SGLang's attention CP size is not ``CPKV_CP_SIZE``.
    """
    if not selected() or not _is_prefill(args, kwargs):
        return
    cp_size = _group_cp_size()
    if cp_size > 1:
        from sglang.srt.runtime_context import get_parallel

        from .sglang_checks import check_cp_size_matches

        parallel = get_parallel()
        check_cp_size_matches(cp_size, parallel.attn_cp_size)
        self.kv_shard_size, self.kv_shard_rank = cp_size, int(parallel.attn_cp_rank)


def pd_every_cp_rank_sends(result, self, *args, **kwargs) -> None:
    """AFTER ``CommonKVManager.__init__``. Prefill, where ``pd_shard_by_cp_rank`` set the shard: checks every
    CP rank is a sender (``enable_all_cp_ranks_for_transfer``, not a dummy rank). Decode (unsharded, CP 1):
    ``enable_all_cp_ranks_for_transfer = True``, so ``_resolve_rank_mapping`` pulls from every prefill CP
    rank and waits for all their responses (without it SGLang pulls from CP rank 0 only; a decode server
    without cpkv needs SGLang's ``SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER=1``, which sets the same flag).

    Raises: ConfigError for a prefill CP rank that is not a sender (SGLang's CP-TP group sharing, which
    sends as TP ranks).
    """
    if not selected():
        return
    if _mode(args, kwargs) == "decode":
        self.enable_all_cp_ranks_for_transfer = True
        return
    if _is_prefill(args, kwargs) and self.kv_shard_size > 1:
        if not self.enable_all_cp_ranks_for_transfer or getattr(self, "is_dummy_cp_rank", False):
            raise ConfigError(
                f"PD prefill CP rank {self.kv_shard_rank} of {self.kv_shard_size} is not a KV sender "
                "(--enable-cp-tp-group-sharing?): cpkv's pages live on every CP rank"
            )


# --------------------------------------------------------------------------------------- registration
def hooks() -> list[tuple[str, object, str]]:
    """``(target, hook, kind)`` for each hook, ``kind`` a ``HookType`` name: the ones above, then
    ``sglang_cp_split``'s (the CP prefill's split from cpkv's plan) and ``sglang_hicache``'s (HiCache
    write-back/load-back and L3 keys on the recorded owner lanes)."""
    kinds = {
        "widen_scheduler": "BEFORE",
        "check_full_pool": "AROUND",
        "prefill_adder_overhead": "AFTER",
        "pd_shard_by_cp_rank": "BEFORE",
        "pd_every_cp_rank_sends": "AFTER",
    }
    from .sglang_cp_split import hooks as cp_split_hooks
    from .sglang_hicache import hooks as hicache_hooks

    own = [(TARGETS[name], globals()[name], kind) for name, kind in kinds.items()]
    return own + cp_split_hooks() + hicache_hooks()


def hook_applied(target: str, hook) -> bool:
    """Whether the callable at ``target`` is a ``HookRegistry`` wrapper chain holding ``hook``."""
    import pkgutil

    try:
        fn = pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError):
        return False
    while fn is not None:
        if any(
            getattr(cell, "cell_contents", None) is hook for cell in getattr(fn, "__closure__", None) or ()
        ):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


_registered = False


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: nothing unless ``SGLANG_PLATFORM=cpkv``; then check the
    SGLang version, register and apply every hook, and check each wraps its target.

    Raises:
        SGLangStartError: another SGLang version, or a hook that did not apply; one line naming it.
    """
    global _registered
    if not selected() or _registered:
        return
    from .sglang_checks import check_sglang_version

    try:
        version = check_sglang_version()
    except ConfigError as e:
        raise SGLangStartError(f"cpkv: {e}") from None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in hooks():
        HookRegistry.register(target, hook, HookType[kind])
    HookRegistry.apply_hooks()
    _registered = True
    missing = sorted({target for target, hook, _ in hooks() if not hook_applied(target, hook)})
    if missing:
        raise SGLangStartError(
            f"cpkv: SGLang {version} hook did not apply: {', '.join(missing)} "
            "(see SGLang's 'Failed to apply hooks' log above); the start stops"
        )
