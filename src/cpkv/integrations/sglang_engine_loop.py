"""An SGLang 0.5.23 engine loop on the CPU over the Mooncake trace, the model forward replaced (docs/sglang.md).

``EngineLoop`` drives SGLang's own scheduler components step by step, the way ``Scheduler.get_new_batch_prefill``
does: ``Req.init_next_round_input`` (prefix match), ``PrefillAdder.add_one_req`` (admission, HiCache
load-back through ``init_load_back``), ``ScheduleBatch.init_new`` + ``prepare_for_extend``
(``alloc_for_extend`` on the allocator), ``UnifiedRadixCache`` with HiCache (``HybridCacheController``,
``io_backend="direct"``) and an L3 ``file`` store, ``release_kv_cache`` (the finished request cached), and
SGLang's ``SchedulerInvariantChecker`` after every step. The allocator is the one SGLang's platform hook
returns under ``SGLANG_PLATFORM=cpkv`` (cpkv's), or, as the peer, SGLang's own ``PageInterleavePoolAllocator``
(its ``--enable-kv-cache-sharding`` allocator, rotation bases and owner-preserving ``alloc_cyclic`` load-back).

The model forward is replaced by writing each extend token's known K/V rows (``kv_rows``: the token id, its
position and the lane that computed it) through cpkv's KV-row path (``sglang_kv_rows.write_kv_rows`` on the
C ranks' own pools) and into the group view SGLang's HiCache copies from (one process holds every rank).
The rows travel through host memory and L3 with the page, so a page loaded back onto another lane than the
one that computed it fails ``checks``, which runs after every step. With L3 the host pool is write-through
(L3 then holds whole prefixes from the root) and every prefetch and backup is awaited, so a run is
repeatable. Each request is prefill only (its output is not decoded).
"""

from __future__ import annotations

import os
import time
from array import array
from types import SimpleNamespace

import numpy as np
import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
from sglang.srt.managers.scheduler_components.pool_stats_observer import SchedulerPoolStatsObserver
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from ..errors import ConfigError
from .sglang_loop_workload import HEAD_DIM, LoopCheckError, LoopConfig, LoopStats, kv_rows, scaled_prompts


def install_plugins() -> None:
    """What an SGLang process does at start under ``SGLANG_PLATFORM=cpkv``: run the ``sglang.srt.plugins``
    entry points (cpkv's scheduler hooks, ``sglang_hooks``), and cpkv's HiCache hooks (``sglang_hicache``)
    where the plugin did not register them. Call once, before building an ``EngineLoop``."""
    os.environ.setdefault("CPKV_CP_SIZE", "4")
    os.environ["SGLANG_PLATFORM"] = "cpkv"
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    from . import sglang_hicache, sglang_hooks

    load_plugins()
    target, hook, _ = sglang_hooks.hooks()[1]
    if not sglang_hooks.hook_applied(
        target, hook
    ):  # entry point not found (a stale src/cpkv.egg-info ahead on
        # sys.path under PYTHONPATH=src hides the installed one): register it as the entry point would
        sglang_hooks.register()
    if not sglang_hooks.hook_applied(sglang_hicache.HOOK_TARGETS[1], sglang_hicache.load_on_recorded_lanes):
        sglang_hicache.register()
        HookRegistry.apply_hooks()


class EngineLoop:
    """SGLang's scheduler components over one group (module docstring). ``run(prompts)`` returns ``LoopStats``.

    Raises:
        ConfigError: an unknown ``allocator``. AssertionError (SGLang's invariant checker) or
        ``LoopCheckError`` when a check of ``checks`` fails.
    """

    def __init__(self, cfg: LoopConfig) -> None:
        if cfg.allocator not in ("cpkv", "sglang"):
            raise ConfigError(f"allocator={cfg.allocator!r}: use 'cpkv' or 'sglang'")
        self.cfg, C, P = cfg, cfg.cp_size, cfg.page_size
        self.stats = LoopStats()
        size = cfg.rank_pages * P
        args = dict(
            model_path="dummy",
            page_size=P,
            enable_hierarchical_cache=True,
            hicache_io_backend="direct",
            hicache_mem_layout="layer_first",
            hicache_write_policy="write_back",
            hicache_ratio=cfg.host_ratio,
        )
        if cfg.allocator == "sglang":  # its host pool is one rank's rows: the group holds C times as many
            args["hicache_ratio"] = cfg.host_ratio / C
        if cfg.storage_dir is not None:
            os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = cfg.storage_dir
            args["hicache_storage_backend"] = "file"
            args["hicache_storage_backend_extra_config"] = (
                f'{{"prefetch_threshold": {P}}}'  # default 256 tokens
            )
            args["hicache_storage_prefetch_policy"] = "wait_complete"  # a step waits for its L3 reads
            args["hicache_write_policy"] = "write_through"  # L3 holds whole prefixes from the root
        self.server_args = ServerArgs(**args)
        set_global_server_args_for_scheduler(self.server_args)
        # The group view: every rank's rows at their group slots (what one process's HiCache copies).
        pool_kw = dict(
            page_size=P,
            dtype=torch.float32,
            head_num=1,
            head_dim=HEAD_DIM,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        self.kv = MHATokenToKVPool(size=C * (cfg.rank_pages + 1) * P - P, **pool_kw)
        self.rank_pools = []
        if cfg.allocator == "cpkv":
            from .sglang_kv_rows import OwnerLaneMHATokenToKVPool
            from .sglang_platform import OwnerLaneCpuPlatform

            os.environ.update(CPKV_CP_SIZE=str(C), CPKV_OWNER_POLICY=cfg.owner_policy)
            cls = OwnerLaneCpuPlatform().get_paged_allocator_cls()  # the class SGLang's configurator builds
            self.alloc = cls(size, P, torch.float32, "cpu", self.kv, False)
            self.rank_pools = [
                OwnerLaneMHATokenToKVPool(size=size, cp_size=C, cp_rank=r, **pool_kw) for r in range(C)
            ]
        else:
            from sglang.srt.mem_cache.allocator.page_interleave import PageInterleavePoolAllocator
            from sglang.srt.mem_cache.page_interleave import PageInterleavePlacement, PageShardSpec
            from sglang.srt.mem_cache.page_interleave_pool import PageInterleaveKVPoolMixin

            # HiCache wraps its host pool in PageInterleaveHostPool (owner-classed host slots) for a pool
            # that carries SGLang's placement; the NCCL gather state is not built (no forward here).
            self.kv = type("PeerKVPool", (PageInterleaveKVPoolMixin, MHATokenToKVPool), {})(
                size=C * (cfg.rank_pages + 1) * P - P, **pool_kw
            )
            self.kv.placement = PageInterleavePlacement(PageShardSpec(0, C, P, C * P, P))
            self.alloc = PageInterleavePoolAllocator(size, P, C, torch.float32, "cpu", self.kv, False)
        self.req_pool = ReqToTokenPool(
            size=cfg.max_requests, max_context_len=1 << 14, device="cpu", enable_memory_saver=False
        )
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.alloc,
            page_size=P,
            tree_components=(ComponentType.FULL,),
        )
        self.tree = UnifiedRadixCache(params=params)
        if cfg.storage_dir is None:
            self.tree.init_hicache(self.server_args, params)
        else:  # the file backend keys its pages by the TP rank: one process, rank 0 of 1
            from sglang.srt.runtime_context import get_parallel

            with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
                self.tree.init_hicache(self.server_args, params)
        self.tree.load_back_threshold = 0  # load every host hit back (SGLang's default skips short ones)
        if cfg.storage_dir is not None:  # host pool = 2x device: SGLang's prefetch cap would be 0 here
            cc = self.tree.cache_controller
            cc.prefetch_capacity_limit = max(cc.prefetch_capacity_limit, cc.mem_pool_host.size)
        self._watch_load_back(self.tree.cache_controller)
        self.model_config = SimpleNamespace(vocab_size=1 << 31, is_encoder_decoder=False)
        widening = C  # the scheduler's kv_shard_widening: C for both (cpkv's scheduler hook, SGLang's own)
        self.observer = SchedulerPoolStatsObserver(
            tree_cache=self.tree,
            token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.req_pool,
            session_controller=SimpleNamespace(sessions={}),
            hisparse_coordinator=None,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            enable_hisparse=False,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=size * widening,
        )
        self.last_batch = None
        self.checker = SchedulerInvariantChecker(
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            disaggregation_mode=None,
            page_size=P,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=size * widening,
            tree_cache=self.tree,
            token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.req_pool,
            pool_stats_observer=self.observer,
            get_last_batch=lambda: self.last_batch,
            get_running_batch=lambda: None,
            scheduler_stage_metrics=None,
        )
        self.waiting: list[Req] = []
        self._prefetched: set[str] = set()

    # ------------------------------------------------------------------------------- load-back oracle
    def _watch_load_back(self, controller) -> None:
        """Record each host page's lane at write-back and compare it with the lane of every page loaded
        back (an oracle independent of cpkv's hooks: it wraps the controller instance)."""
        P, C = self.cfg.page_size, self.cfg.cp_size
        lanes: dict[int, int] = {}
        write, load = controller.write, controller.load

        def watched_write(device_indices, *args, **kwargs):
            host = write(device_indices, *args, **kwargs)
            if host is not None:
                for h, d in zip(host[::P].tolist(), device_indices[::P].tolist(), strict=True):
                    lanes[h // P] = (d // P) % C
            return host

        def watched_load(host_indices, *args, **kwargs):
            out = load(host_indices, *args, **kwargs)
            pages = host_indices[::P].tolist()
            if out is None:
                self.stats.pages_recomputed += len(pages)
                return out
            got = ((out[::P] // P) % C).tolist()
            self.stats.load_back_pages += len(pages)
            if self.cfg.storage_dir is None:  # with L3, a host page can be filled from storage, not by write
                self.stats.load_back_off_lane_pages += sum(
                    lanes.get(h // P, g) != g for h, g in zip(pages, got, strict=True)
                )
            return out

        controller.write, controller.load = watched_write, watched_load

    # ------------------------------------------------------------------------------------------ steps
    def submit(self, rid: int, tokens: np.ndarray) -> None:
        """Queue one prompt (prefill only); with L3, start its storage prefetch as SGLang's scheduler does."""
        sp = SamplingParams(max_new_tokens=0)
        sp.normalize(None)
        req = Req(str(rid), "", array("q", tokens.tolist()), sp)
        self.stats.requests += 1
        self.stats.prompt_tokens += len(tokens)
        if self.cfg.storage_dir is not None:
            req.init_next_round_input(self.tree, cow_mamba=False)
            matched, node, ids = (
                req.prefix_len + req.host_hit_length,
                req.last_host_node,
                req.full_untruncated_fill_ids,
            )
            if self.tree.is_backuped(node) or self.tree.is_root(node):  # Scheduler._prefetch_kvcache's call
                self.tree.prefetch_from_storage(
                    req.cache_request_handle,
                    node,
                    ids[matched:],
                    self.tree.get_last_hash_value(node),
                    None,
                    matched_prefix_tokens=ids[:matched],
                )
        self.waiting.append(req)

    def step(self) -> int:
        """One prefill step: admit from the queue, allocate, write the K/V rows, cache the finished requests,
        run the checks. Returns the requests run."""
        cfg = self.cfg
        adder = PrefillAdder(
            cfg.page_size, self.tree, self.alloc, ScheduleBatch(reqs=[]), 0.5, cfg.max_prefill_tokens, None
        )
        for req in self.waiting:
            if cfg.storage_dir is not None and req.rid not in self._prefetched:
                self._await_prefetch(req)  # synchronous: the same L3 hits at every run
            req.init_next_round_input(self.tree)
            if (
                adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
                != AddReqResult.CONTINUE
            ):
                break
        run = adder.can_run_list
        if not run:
            self.tree.check_hicache_events()
            return 0
        chosen = {id(r) for r in run}
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        batch = ScheduleBatch.init_new(
            run, self.req_pool, self.alloc, self.tree, self.model_config, False, SpeculativeAlgorithm.NONE
        )
        batch.hicache_consumer_index = self.tree.ready_to_load_host_cache()
        batch.prepare_for_extend()
        self.last_batch = batch
        self._forward(batch)
        self._check_pool(busy=True)
        for req in run:
            s = self.stats
            s.device_hit_tokens += req.cached_tokens_device
            s.host_hit_tokens += req.cached_tokens_host
            s.storage_hit_tokens += req.cached_tokens_storage
            s.computed_tokens += req.extend_len
            req.finished_reason = _Finished()
            release_kv_cache(req, self.tree, checkpoint=True)
        self.last_batch = None
        self.tree.check_hicache_events()
        if cfg.storage_dir is not None:  # every L3 backup of the step written before the next: deterministic
            self._wait(
                lambda: (self.tree.drain_storage_control_queues(), not self.tree.ongoing_backup)[1],
                "L3 backup",
            )
        self.stats.steps += 1
        self.checks()
        return len(run)

    def _await_prefetch(self, req, timeout_s: float = 60.0) -> None:
        """Drive HiCache's events until the request's L3 prefetch is done, then take its loaded span."""
        handle = req.cache_request_handle
        self._wait(
            lambda: (self.tree.check_hicache_events(), self.tree.check_prefetch_progress(handle))[1],
            f"request {req.rid}'s L3 prefetch",
            timeout_s,
        )
        loaded, start = self.tree.pop_prefetch_loaded_span(req.cache_request_handle)
        if loaded > 0:
            req.storage_hit_length, req.storage_hit_start, req.host_hit_is_storage = loaded, start, False
        self._prefetched.add(req.rid)

    def _wait(self, done, what: str, timeout_s: float = 60.0) -> None:
        """Poll ``done()`` (HiCache's storage threads run meanwhile) until true; LoopCheckError after the timeout."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise LoopCheckError(f"step {self.stats.steps}: {what} did not finish in {timeout_s} s")
            time.sleep(0.001)

    def run(self, prompts: list[np.ndarray]) -> LoopStats:
        """Submit ``arrivals`` prompts a step and step until every prompt ran; returns the stats."""
        nxt = 0
        while nxt < len(prompts) or self.waiting:
            for _ in range(self.cfg.arrivals):
                if nxt < len(prompts):
                    self.submit(nxt, prompts[nxt])
                    nxt += 1
            self.step()
        return self.stats

    def _forward(self, batch) -> None:
        """The model forward, replaced: each extend token's known K/V rows at its ``out_cache_loc`` slot, through
        cpkv's KV-row path on the C ranks' own pools (cpkv) and into the group view HiCache copies."""
        toks = [
            torch.tensor(r.origin_input_ids[r.prefix_len : r.extend_end], dtype=torch.int64)
            for r in batch.reqs
        ]
        pos = [torch.arange(r.prefix_len, r.extend_end, dtype=torch.int64) for r in batch.reqs]
        loc = batch.out_cache_loc
        C, P = self.cfg.cp_size, self.cfg.page_size
        k, v = kv_rows(torch.cat(toks), torch.cat(pos), (loc // P) % C)
        layer = SimpleNamespace(layer_id=0)
        self._check_rows(loc)
        self.kv.set_kv_buffer(layer, loc, k, v)
        if self.rank_pools:
            from .sglang_kv_rows import read_kv_rows, write_kv_rows

            write_kv_rows(self.rank_pools, layer, loc, k, v)
            rk, rv = read_kv_rows(self.rank_pools, 0, loc)
            if not (torch.equal(rk, k) and torch.equal(rv, v)):
                raise LoopCheckError(f"step {self.stats.steps}: rows read back through read_slots differ")

    # ----------------------------------------------------------------------------------------- checks
    def _check_rows(self, loc: torch.Tensor) -> None:
        """No row out of its rank's buffer: every slot's local row (``(p // C) * P + o``) < one rank's rows."""
        C, P = self.cfg.cp_size, self.cfg.page_size
        local = (loc // (C * P)) * P + loc % P
        if loc.numel() and (int(loc.min()) < C * P or int(local.max()) >= (self.cfg.rank_pages + 1) * P):
            raise LoopCheckError(
                f"step {self.stats.steps}: a slot outside the ranks' buffers "
                f"(min {int(loc.min())}, largest local row {int(local.max())})"
            )

    def _check_pool(self, busy: bool) -> None:
        """SGLang's invariant checker: the full pool's conservation (with the rows the batch holds when busy),
        the request pool when idle, and the KV page invariants (no owner page free, no double free)."""
        uncached = self.checker._get_total_uncached_sizes()[0] if busy else 0
        leak, msg = self.checker._check_full_pool(self.observer.get_pool_stats(), uncached=uncached)
        if leak:
            raise LoopCheckError(f"step {self.stats.steps}: SGLang's invariant checker: {msg}")
        self.checker._check_kv_page_invariants()
        if not busy:
            self.checker._check_req_pool()
        if self.checker.count_memory_leak_warnings or self.checker.count_req_pool_leak_warnings:
            raise LoopCheckError(f"step {self.stats.steps}: SGLang's invariant checker warned")
        self.stats.invariant_checks += 1

    def checks(self) -> None:
        """After a step: the invariant checker (idle), every device page of the tree holding the K/V rows of
        its tokens at their positions (group view), and the lanes' held pages for the peak and imbalance."""
        self._check_pool(busy=False)
        P, C = self.cfg.page_size, self.cfg.cp_size
        slots, tokens, positions = self._device_tree_rows()
        if (
            slots.numel()
        ):  # the peer's HiCache moves rank 0's own rows only (one process): rows checked for cpkv
            self._check_rows(slots)
        if slots.numel() and self.rank_pools:
            k, v = kv_rows(tokens, positions, (slots // P) % C)
            got_k, got_v = self.kv.k_buffer[0][slots], self.kv.v_buffer[0][slots]
            bad = ((got_k != k) | (got_v != v)).any(dim=2).any(dim=1).nonzero().reshape(-1)
            if bad.numel():
                i = int(bad[0])
                why = (
                    f"holds rows computed on lane {int(got_v[i, 0, 3])}"
                    if torch.equal(got_k[i], k[i])
                    else "does not hold its token's K/V rows"
                )
                raise LoopCheckError(
                    f"step {self.stats.steps}: cached slot {int(slots[i])} (lane "
                    f"{int(slots[i]) // P % C}, position {int(positions[i])}) {why}"
                )
            self.stats.checked_pages += slots.numel() // P
        free = self.alloc.get_all_free_pages()
        held = self.cfg.rank_pages - np.bincount((free.numpy() % C), minlength=C)
        self.stats.lane_peak = max(self.stats.lane_peak, int(held.max()))
        if held.sum():
            self.stats.imbalance_peak = max(self.stats.imbalance_peak, float(held.max() / held.mean()))

    def _device_tree_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every device slot of the tree with its token id and position (a walk from the root)."""
        core = self.tree.tree_core
        slots, toks, pos = [], [], []
        stack = [(core.root_node, 0)]
        while stack:
            node, depth = stack.pop()
            key = node.key
            n = 0 if key is None else len(key)
            value = node.component_data[ComponentType.FULL].value
            if node is not core.root_node and isinstance(value, torch.Tensor) and value.numel():
                slots.append(value.to(torch.int64))
                toks.append(torch.tensor(key.token_ids[: value.numel()], dtype=torch.int64))
                pos.append(torch.arange(depth, depth + value.numel(), dtype=torch.int64))
            stack.extend((child, depth + n) for child in node.children.values())
        empty = torch.zeros(0, dtype=torch.int64)
        return (empty, empty, empty) if not slots else (torch.cat(slots), torch.cat(toks), torch.cat(pos))


class _Finished:  # a finished reason for a prefill-only request (Req.finished() reads finished_reason)
    pass


__all__ = [
    "EngineLoop",
    "LoopCheckError",
    "LoopConfig",
    "LoopStats",
    "install_plugins",
    "kv_rows",
    "scaled_prompts",
]
