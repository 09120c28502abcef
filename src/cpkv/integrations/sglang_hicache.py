"""SGLang 0.5.23 HiCache load-back on the recorded owner lanes (SPEC C-RELOAD), installed as plugin hooks.

AROUND hooks (``HookRegistry``; no SGLang file patched) on ``HybridCacheController.write`` (record each host
page's owner lane), ``.load`` (allocate every page on its recorded lane; a lane still short returns None,
counted as ``load_back_owner_lane_capacity_failed``, and SGLang recomputes the host part),
``UnifiedRadixCache._load_back_transfers`` (the free-row gate is ``aggregate_free_size``) and
``.attach_storage_backend`` (L3 keys ``<key>_lane<r>``, probed by ``LaneProbingStorage``). How and why:
docs/sglang.md, "HiCache on the recorded owner lanes".

Every hook passes straight through when ``SGLANG_PLATFORM`` is not ``cpkv`` or the allocator is not cpkv's.
cpkv's ``sglang.srt.plugins`` plugin (``sglang_hooks``) registers them.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import AllocatorError

CONTROLLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller.HybridCacheController"
TREE = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"
HOOK_TARGETS = (
    f"{CONTROLLER}.write",
    f"{CONTROLLER}.load",
    f"{CONTROLLER}.attach_storage_backend",
    f"{TREE}._load_back_transfers",
    f"{TREE}._component_available_size",
)
"""The dotted paths ``register`` hooks, in order."""

COUNTERS = (
    "load_back_pages",
    "load_back_owner_lane_capacity_failed",
    "load_back_failed_pages",
    "l3_pages_read",
)


def lane_key(key: str, lane: int) -> str:
    """The L3 storage key of a page whose owner lane is ``lane``: ``f"{key}_lane{lane}"``."""
    return f"{key}_lane{int(lane)}"


class HostLanes:
    """Owner lane of each host page of one ``HybridCacheController``, and its load-back counters.

    Attributes:
        cp_size, page_size: the allocator's C and P.
        counts: ``{name: int}`` for ``COUNTERS`` (pages or events, as named).
        l3_lanes: ``{storage key: lane}`` found by the last L3 hit queries.
    """

    def __init__(self, cp_size: int, page_size: int) -> None:
        self.cp_size, self.page_size = int(cp_size), int(page_size)
        self._owner = np.full(0, -1, dtype=np.int64)  # [host pages] recorded lane, -1 none
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.l3_lanes: dict[str, int] = {}

    def host_pages(self, host_indices) -> np.ndarray:
        """Host page ids ``host_indices[::P] // P`` (int64 ``[n]``) of page-aligned host rows."""
        rows = np.asarray(torch.as_tensor(host_indices).cpu(), dtype=np.int64).reshape(-1)
        P = self.page_size
        if rows.size % P or (rows.size and (rows[::P] % P).any()):
            raise AllocatorError(
                f"host rows are not whole pages of page_size={P}: {rows[: 2 * P].tolist()} ..."
            )
        return rows[::P] // P

    def record(self, host_indices, lanes) -> None:
        """Record ``lanes`` (``[n]``) as the owners of the ``n`` host pages of ``host_indices``."""
        pages = self.host_pages(host_indices)
        if pages.size and pages.max() >= self._owner.size:
            grown = np.full(int(pages.max()) + 1, -1, dtype=np.int64)
            grown[: self._owner.size] = self._owner
            self._owner = grown
        self._owner[pages] = np.asarray(lanes, dtype=np.int64).reshape(-1)

    def owners(self, host_indices) -> np.ndarray:
        """Recorded lanes of the host pages of ``host_indices``, int64 ``[n]``.

        Raises: AllocatorError naming the first host page with no recorded owner (not written back by
        this controller nor read from L3 through it).
        """
        pages = self.host_pages(host_indices)
        lanes = np.where(pages < self._owner.size, self._owner[np.minimum(pages, self._owner.size - 1)], -1)
        if (lanes < 0).any():
            raise AllocatorError(f"host page {int(pages[np.argmax(lanes < 0)])} has no recorded owner lane")
        return lanes


def cpkv_allocator(controller):
    """The cpkv ``OwnerLaneTokenToKVPoolAllocator`` behind a controller while ``SGLANG_PLATFORM=cpkv``
    (read at every call), else None."""
    from .sglang import OwnerLaneTokenToKVPoolAllocator
    from .sglang_checks import selected  # not sglang_hooks: that module imports this one

    if not selected():
        return None

    alloc = controller.mem_pool_device_allocator
    alloc = getattr(alloc, "full_attn_allocator", alloc)
    return alloc if isinstance(alloc, OwnerLaneTokenToKVPoolAllocator) else None


def host_lanes(controller) -> HostLanes | None:
    """``controller.cpkv_lanes`` (created on first use) when its allocator is cpkv's, else None."""
    alloc = cpkv_allocator(controller)
    if alloc is None:
        return None
    lanes = getattr(controller, "cpkv_lanes", None)
    if lanes is None:
        lanes = controller.cpkv_lanes = HostLanes(alloc.cp_size, alloc.page_size)
    return lanes


# ------------------------------------------------------------------------------------------- the hooks
def write_recording_owners(original, self, device_indices, *args, **kwargs):
    """AROUND ``HybridCacheController.write``: record the owner lane of every host page written."""
    host = original(self, device_indices, *args, **kwargs)
    record = host_lanes(self)
    if record is not None and host is not None and len(host):
        P = record.page_size
        slots = np.asarray(torch.as_tensor(device_indices).cpu(), dtype=np.int64).reshape(-1)
        record.record(host, (slots[::P] // P) % record.cp_size)
    return host


def load_on_recorded_lanes(original, self, host_indices, *args, device_indices=None, **kwargs):
    """AROUND ``HybridCacheController.load``: rows on the recorded lanes, or None (recompute), never a wait."""
    record = host_lanes(self)
    if record is None or device_indices is not None or host_indices.numel() == 0:
        return original(self, host_indices, *args, device_indices=device_indices, **kwargs)
    alloc = cpkv_allocator(self)
    owners = record.owners(host_indices)
    if not _make_room(alloc, getattr(self, "cpkv_tree", None), owners):
        record.counts["load_back_owner_lane_capacity_failed"] += 1
        record.counts["load_back_failed_pages"] += int(owners.size)
        return None
    pages = alloc.lanes.alloc_pages(owners)
    P = alloc.page_size
    rows = torch.from_numpy((pages[:, None] * P + np.arange(P)).reshape(-1)).to(alloc.device)
    try:
        out = original(self, host_indices, *args, device_indices=rows, **kwargs)
    except BaseException:
        alloc.free_page_ids(torch.from_numpy(pages))
        raise
    if out is None:  # SGLang keeps caller-owned rows on failure: give them back
        alloc.free_page_ids(torch.from_numpy(pages))
        return None
    record.counts["load_back_pages"] += int(pages.size)
    return out


def _make_room(alloc, tree, owners: np.ndarray) -> bool:
    """Whether every recorded lane has room for its pages, after returning staged pages (``need_sort``)
    and, while a lane is short, evicting unlocked tree pages (SGLang's tree evicts the least recently used
    pages by count, not by lane: each round asks for the largest shortfall; stops when nothing is evicted)."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    need = np.bincount(owners, minlength=alloc.cp_size)
    while True:
        short = need - alloc.lanes.free_pages_per_lane()
        if (short <= 0).all():
            return True
        if alloc.aggregate_free_size() > alloc.page_size * alloc.lanes.total_free_pages:  # pages staged
            alloc.merge_and_sort_free()
            continue
        if (
            tree is None
            or tree.evict(EvictParams(num_tokens=int(short.max()) * alloc.page_size)).num_tokens_evicted == 0
        ):
            return False


def load_back_transfers_on_lanes(original, self, *args, **kwargs):
    """AROUND ``UnifiedRadixCache._load_back_transfers``: mark the load-back (the gate below) and give the
    controller its tree (lane-targeted eviction in ``load_on_recorded_lanes``)."""
    controller = self.cache_controller
    if controller is None or cpkv_allocator(controller) is None:
        return original(self, *args, **kwargs)
    controller.cpkv_tree = self
    self.cpkv_loading_back = True
    try:
        return original(self, *args, **kwargs)
    finally:
        self.cpkv_loading_back = False


def available_size_for_load_back(original, self, component_type):
    """AROUND ``UnifiedRadixCache._component_available_size``: during a cpkv load-back the FULL gate is
    the aggregate free rows (the lanes are checked one by one when the rows are allocated)."""
    if getattr(self, "cpkv_loading_back", False) and getattr(component_type, "name", None) == "FULL":
        return self.token_to_kv_pool_allocator.aggregate_free_size()
    return original(self, component_type)


def attach_storage_with_lane_keys(result, self, *args, **kwargs):
    """AFTER ``HybridCacheController.attach_storage_backend``: L3 keys carry the owner lane (module doc)."""
    record = host_lanes(self)
    if record is None or getattr(self.storage_backend, "cpkv_lane_keys", False):
        return result
    self.storage_backend = LaneProbingStorage(self.storage_backend, record)
    self.page_set_func = _set_with_lanes(self.page_set_func, record)
    self.page_get_func = _get_with_lanes(self.page_get_func, record)
    return result


class LaneProbingStorage:
    """An L3 backend whose ``batch_exists`` finds each page under its lane key (``lane_key``); every other
    attribute is the wrapped backend's. Found lanes go to ``HostLanes.l3_lanes`` for the page reads."""

    cpkv_lane_keys = True

    def __init__(self, inner, record: HostLanes) -> None:
        self._inner, self._record = inner, record

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def batch_exists(self, keys, extra_info=None) -> int:
        """Consecutive pages from the start stored under some lane's key (the backend's contract)."""
        for i, key in enumerate(keys):
            lane = next(
                (
                    r
                    for r in range(self._record.cp_size)
                    if self._inner.batch_exists([lane_key(key, r)], extra_info) == 1
                ),
                None,
            )
            if lane is None:
                return i
            self._record.l3_lanes[key] = lane
        return len(keys)


def _set_with_lanes(page_set, record: HostLanes):
    """A controller ``page_set_func`` whose keys carry each host page's recorded lane."""

    def set_pages(hash_values, host_indices, extra_info=None):
        lanes = record.owners(host_indices)
        return page_set(
            [lane_key(k, r) for k, r in zip(hash_values, lanes, strict=True)], host_indices, extra_info
        )

    return set_pages


def _get_with_lanes(page_get, record: HostLanes):
    """A controller ``page_get_func`` reading lane keys; records the lane of each host page it fills."""

    def get_pages(operation, hash_values, host_indices, extra_info=None):
        lanes = [record.l3_lanes.pop(k, None) for k in hash_values]
        n = next((i for i, r in enumerate(lanes) if r is None), len(lanes))  # pages whose lane was found
        if n == 0:
            return 0
        P = record.page_size
        hits = page_get(
            operation,
            [lane_key(k, r) for k, r in zip(hash_values[:n], lanes[:n], strict=True)],
            host_indices[: n * P],
            extra_info,
        )
        if hits:
            record.record(host_indices[: hits * P], lanes[:hits])
            record.counts["l3_pages_read"] += int(hits)
        return hits

    return get_pages


_HOOKS = (
    (write_recording_owners, "AROUND"),
    (load_on_recorded_lanes, "AROUND"),
    (attach_storage_with_lane_keys, "AFTER"),
    (load_back_transfers_on_lanes, "AROUND"),
    (available_size_for_load_back, "AROUND"),
)


def hooks() -> list[tuple[str, object, str]]:
    """``(target, hook, kind)`` for each hook of this module, ``kind`` a ``HookType`` name (the format of
    ``sglang_hooks.hooks``, whose plugin registers these too)."""
    return [(target, hook, kind) for target, (hook, kind) in zip(HOOK_TARGETS, _HOOKS, strict=True)]


def register(registry=None) -> tuple[str, ...]:
    """Register the hooks on SGLang's ``HookRegistry`` (or ``registry``, the same API); returns their targets.

    The caller runs ``apply_hooks()`` after every registration (cpkv's ``sglang.srt.plugins`` plugin
    registers them through ``hooks()``).
    """
    if registry is None:
        from sglang.srt.plugins.hook_registry import HookRegistry

        registry = HookRegistry
    from sglang.srt.plugins.hook_registry import HookType

    for target, hook, kind in hooks():
        registry.register(target, hook, HookType[kind])
    return HOOK_TARGETS


__all__ = ["HOOK_TARGETS", "HostLanes", "hooks", "lane_key", "register"]
