"""A small engine loop over SGLang 0.5.23's ``UnifiedRadixCache`` + HiCache with cpkv's allocator (CPU).

Shared by test_sglang_hicache.py and test_sglang_l3.py. One process plays the whole CP group: the KV pool
is SGLang's ``MHATokenToKVPool`` over the group's rank-major rows (``C * Q * P``), so cpkv's slot ids
index it directly. Each token's K row is its token id (V the negative), layer l adds ``1000 * l``, so a
row read back names the token it holds. Token ids: block b of a prompt is one page, tokens
``b * P .. b * P + P - 1``.

The loop: requests prefill in one-page chunks (``evict_from_tree_cache`` then the allocator's
``alloc_extend``, as SGLang's ``alloc_paged_token_slots_extend``; a chunk whose lane is short waits a
step), at most ``max_running`` at once; an admitted request matches its prefix, loads a host hit back
(``UnifiedRadixCache.load_back``, flushed at once), locks its prefix; a finished request is inserted and
unlocked. ``spy`` logs every write-back and load-back from the outside (the test's oracle).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable

import numpy as np
import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import evict_from_tree_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from cpkv.integrations.sglang import OwnerLaneTokenToKVPoolAllocator

LAYERS, HEAD_DIM = 2, 2
os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")  # no Rust build in a test


def block_tokens(blocks, P: int) -> list[int]:
    """Token ids of a prompt of block ids (one page a block)."""
    return [b * P + o for b in blocks for o in range(P)]


def expected_rows(tokens, layer: int) -> torch.Tensor:
    """K rows ``[n, 1, HEAD_DIM]`` of these tokens at ``layer``."""
    return (torch.tensor(tokens, dtype=torch.float32) + 1000 * layer)[:, None, None].expand(-1, 1, HEAD_DIM)


class Engine:
    """SGLang's tree + HiCache over cpkv's allocator at (C, policy); see the module docstring.

    Attributes: alloc, kv, cache, controller; writes / loads: the spy's logs, ``(host pages, lanes)``
    per write-back and ``(host pages, device lanes)`` per load; steps, waits (chunks that found their
    lane short), finished (request ids).
    """

    def __init__(
        self,
        cp_size,
        policy,
        *,
        page_size=4,
        rank_pages=16,
        host_ratio=4.0,
        layout="layer_first",
        storage=None,
        storage_extra=None,
        max_running=4,
    ):
        C, P = cp_size, page_size
        self.C, self.P, self.max_running = C, P, max_running
        rows = C * (rank_pages + 1) * P
        self.kv = MHATokenToKVPool(
            size=rows - P,
            page_size=P,
            dtype=torch.float32,
            head_num=1,
            head_dim=HEAD_DIM,
            layer_num=LAYERS,
            device="cpu",
            enable_memory_saver=False,
        )
        cls = OwnerLaneTokenToKVPoolAllocator.for_group(C, policy)
        self.alloc = cls(rank_pages * P, P, torch.float32, "cpu", self.kv, False)
        args = ServerArgs(
            model_path="dummy",
            page_size=P,
            hicache_io_backend="direct",
            hicache_mem_layout=layout,
            hicache_write_policy="write_back",
            hicache_ratio=host_ratio,
            hicache_storage_backend=storage,
            hicache_storage_backend_extra_config=storage_extra,
        )
        set_global_server_args_for_scheduler(args)
        r2t = ReqToTokenPool(size=8, max_context_len=4096, device="cpu", enable_memory_saver=False)
        params = CacheInitParams(
            req_to_token_pool=r2t,
            token_to_kv_pool_allocator=self.alloc,
            page_size=P,
            disable=False,
            tree_components=(ComponentType.FULL,),
        )
        self.cache = UnifiedRadixCache(params=params)
        self.cache.init_hicache(args, params)
        self.cache.load_back_threshold = 0
        self.controller = self.cache.cache_controller
        self.writes: list[tuple[np.ndarray, np.ndarray]] = []
        self.loads: list[tuple[np.ndarray, np.ndarray]] = []
        self._spy()
        self.steps = self.waits = 0
        self.finished: list[int] = []

    # ------------------------------------------------------------------------------------- the oracle
    def _spy(self) -> None:
        """Log write-backs and load-backs from outside the hooks (instance attributes over the class's)."""
        ctl, P, C = self.controller, self.P, self.C
        write, load = ctl.write, ctl.load

        def spied_write(device_indices, *args, **kwargs):
            host = write(device_indices, *args, **kwargs)
            if host is not None and len(host):
                self.writes.append((host[::P].numpy() // P, (device_indices[::P].numpy() // P) % C))
            return host

        def spied_load(host_indices, *args, **kwargs):
            out = load(host_indices, *args, **kwargs)
            if out is not None and len(out):
                self.loads.append((host_indices[::P].numpy() // P, (out[::P].numpy() // P) % C))
            return out

        ctl.write, ctl.load = spied_write, spied_load

    def recorded_lane(self, host_page: int) -> int:
        """The lane of the device page the latest write-back to ``host_page`` copied (the spy's record)."""
        for pages, lanes in reversed(self.writes):
            hit = np.flatnonzero(pages == host_page)
            if hit.size:
                return int(lanes[hit[0]])
        raise AssertionError(f"host page {host_page} was never written back")

    def rows_equal(self, tokens, slots) -> bool:
        """Whether every layer's K rows at ``slots`` hold ``tokens`` (and V their negatives)."""
        s = torch.as_tensor(slots, dtype=torch.int64)
        return all(
            torch.equal(self.kv.get_key_buffer(layer)[s], expected_rows(tokens, layer))
            and torch.equal(self.kv.get_value_buffer(layer)[s], -expected_rows(tokens, layer))
            for layer in range(LAYERS)
        )

    # ------------------------------------------------------------------------------------- the loop
    def match(self, tokens):
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))

    def load_back(self, tokens) -> tuple[int, bool | None]:
        """Match ``tokens``; load a host hit back and flush it. Returns (device prefix tokens, loaded or None)."""
        m = self.match(tokens)
        loaded = None
        if m.host_hit_length > 0:
            loaded = self.cache.load_back(m.best_match_node)
            self.flush()
            m = self.match(tokens)
        return m, loaded

    def flush(self) -> None:
        """Finish pending host loads (the ``direct`` copies run on the CPU stream)."""
        self.cache.ready_to_load_host_cache()
        for ack in list(self.controller.ack_load_queue):
            ack.finish_event.synchronize()
        self.cache.loading_check()

    def admit(self, rid: int, tokens: list[int]) -> dict:
        m, _ = self.load_back(tokens)
        L0 = m.device_prefix_len
        prefix = self.cache.path_device_indices(m.last_device_node)[:L0]
        assert self.rows_equal(tokens[:L0], prefix), f"request {rid}: cached rows differ from its tokens"
        lock = self.cache.inc_lock_ref(m.last_device_node).to_dec_params()
        return {
            "rid": rid,
            "tokens": tokens,
            "slots": prefix.clone(),
            "node": m.last_device_node,
            "lock": lock,
            "prefix": L0,
        }

    def chunk(self, req) -> bool:
        """Prefill one page of ``req``; False when its lane is short (the chunk waits)."""
        done, P = len(req["slots"]), self.P
        n = min(P, len(req["tokens"]) - done)
        last = torch.tensor([int(req["slots"][-1]) if done else -1])
        L0, seq = torch.tensor([done]), torch.tensor([done + n])
        need = self.alloc.get_extend_allocation_demand(L0, seq, conservative_num_tokens=n + P, shard_size=1)
        evict_from_tree_cache(self.cache, need)
        out = self.alloc.alloc_extend(L0, L0, seq, seq, last, n)
        if out is None:
            return False
        toks = req["tokens"][done : done + n]
        for layer in range(LAYERS):  # the model forward: each token's known K/V rows
            self.kv.get_key_buffer(layer)[out] = expected_rows(toks, layer)
            self.kv.get_value_buffer(layer)[out] = -expected_rows(toks, layer)
        req["slots"] = torch.cat([req["slots"], out])
        return True

    def finish(self, req) -> None:
        tokens, slots = req["tokens"], req["slots"]
        full = len(tokens) // self.P * self.P
        # the tree frees our copies of pages it holds already (past prev_prefix_len, the part we matched)
        key = RadixKey(array("q", tokens[:full]))
        self.cache.insert(InsertParams(key=key, value=slots[:full], prev_prefix_len=req["prefix"]))
        if full < len(tokens):
            self.alloc.free(slots[full:])
        self.cache.dec_lock_ref(req["node"], req["lock"])
        self.finished.append(req["rid"])

    def run(self, requests, max_steps: int) -> None:
        """Run ``[(rid, tokens)]`` (arrived together) to completion or ``max_steps`` steps."""
        waiting, running = list(requests), []
        for _ in range(max_steps):
            if not waiting and not running:
                return
            while waiting and len(running) < self.max_running:
                running.append(self.admit(*waiting.pop(0)))
            self.steps += 1
            for req in list(running):
                if not self.chunk(req):
                    self.waits += 1
                elif len(req["slots"]) == len(req["tokens"]):
                    running.remove(req)
                    self.finish(req)


def install(register) -> Callable[[], None]:
    """Apply ``register(registry)``'s hooks on a private ``HookRegistry`` subclass (its own hook lists, so
    SGLang's global registry is untouched) and the HiCache CPU stand-ins; returns the undo, which puts
    back the attributes the hooks replaced. ``register`` returns the dotted targets it registered."""
    import pkgutil
    from collections import defaultdict

    from sglang.srt.plugins.hook_registry import HookRegistry

    from cpkv.integrations.sglang_hicache_cpu import install_hicache_cpu_standins

    registry = type("TestHookRegistry", (HookRegistry,), {"_hooks": defaultdict(list), "_patched": set()})
    targets = register(registry)
    saved = []
    for target in targets:
        owner_path, attr = target.rsplit(".", 1)
        owner = pkgutil.resolve_name(owner_path)
        saved.append((owner, attr, owner.__dict__[attr]))
    registry.apply_hooks()
    assert registry._patched == set(targets), f"hooks not applied: {set(targets) - registry._patched}"
    undo_standins = install_hicache_cpu_standins()

    def undo() -> None:
        undo_standins()
        for owner, attr, old in saved:
            setattr(owner, attr, old)

    return undo
