"""One policy's replay: a deterministic step loop over cpkv's real allocator and prefix cache (issue 8).

Each step: admit arrivals (prefix match, host load-back, lock), form a chunked-prefill batch in admission
order, plan it with the group's ``OwnerLaneAllocator`` (checking the MQA-logits budget on the real plan),
allocate it atomically (evicting on the short lane, then shrinking the batch), advance time by the cost
model, hand finished requests' pages to the prefix cache. Nothing here re-implements planning or
allocation: the simulator drives the library exactly as an engine's scheduler would.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..allocator import OwnerLaneAllocator
from ..cache import PrefixCache
from ..config import CPConfig
from ..errors import LaneExhausted
from ..estimator import mqa_logits_elements
from ..planner import zigzag_lane_pages
from .config import SimConfig
from .cost import step_work
from .metrics import StepRecorder, compute_imbalance_mean, lane_metrics, percentile_ms
from .report import PolicyResult
from .spec_decode import SpecDecoder
from .workload import Request, prompt_token_ids

_I64 = np.int64


@dataclass(eq=False)
class _Running:
    """A request admitted to the group: its prompt, ``req_to_token`` row and progress (tokens)."""

    req: Request
    token_ids: np.ndarray  # [input_length] int64
    slots: np.ndarray  # [input_length + output_length] int64 req_to_token row, -1 where not yet computed
    done: int  # tokens whose KV exists (cached prefix + computed)
    handle: object  # lock handle of the matched prefix
    own_pages: list = field(default_factory=list)  # arrays of pages allocated for this request
    decoded: int = 0

    @property
    def remaining(self) -> int:
        return self.req.input_length - self.done

    @property
    def last_loc(self) -> int:
        return int(self.slots[self.done - 1]) if self.done else -1


class PolicyRun:
    """State of one policy's replay (counters are per run; nothing is global).

    Args:
        config: the ``SimConfig``. policy: ``rotation`` | ``legacy`` | ``balanced``.
        requests: the workload, in arrival order.
    """

    def __init__(self, config: SimConfig, policy: str, requests: Sequence[Request]) -> None:
        self.cfg = config
        self.policy = policy
        self.requests = requests
        cp = CPConfig(config.cp_size, config.page_size, policy)
        self.alloc = OwnerLaneAllocator(cp, config.pages_per_lane)
        self.cache = PrefixCache(self.alloc, host_pages_per_lane=config.host_pages_per_lane)
        self.spec = (
            SpecDecoder(self.alloc, config.spec_draft_tokens, config.spec_accept_rate, config.seed)
            if config.spec_draft_tokens else None
        )  # fmt: skip
        self.rec = StepRecorder(config.cp_size)
        self.now_ms = 0.0
        self.waiting: deque[Request] = deque()
        self.running: list[_Running] = []
        self.decoding: list[_Running] = []
        self.ttft_ms: list[float] = []
        self.rejections: dict[int, str] = {}
        self.finished = 0
        self.prefill_tokens = 0
        self.cache_hit_tokens = 0
        self.owner_lane_exhausted = 0
        self.logits_budget_cuts = 0
        self.last_short_lane = -1
        self.livelock: dict | None = None

    # --------------------------------------------------------------------------------------------- run
    def run(self, on_progress: Callable[[int], None] | None = None) -> PolicyResult:
        """Replay every request; returns the ``PolicyResult`` (metrics of docs/metrics.md + timeline)."""
        t0 = time.perf_counter()
        arrivals = deque(self.requests)
        stalled = 0
        while arrivals or self.waiting or self.running or self.decoding:
            if not (self.waiting or self.running or self.decoding) and arrivals[0].arrival_ms > self.now_ms:
                self.now_ms = arrivals[0].arrival_ms  # idle until the next arrival
            while arrivals and arrivals[0].arrival_ms <= self.now_ms:
                self.waiting.append(arrivals.popleft())
            before = self.finished + len(self.rejections)
            self._admit()
            progressed = self._step()
            if on_progress is not None and self.finished + len(self.rejections) != before:
                on_progress(self.finished + len(self.rejections))
            stalled = 0 if progressed else stalled + 1
            if stalled >= self.cfg.livelock_steps:
                self._record_livelock(stalled)
                break
        return self._result(time.perf_counter() - t0)

    # ------------------------------------------------------------------------------------- admission
    def _admit(self) -> None:
        """FCFS admission while pages (free + evictable) cover every admitted request's remaining pages."""
        P, C = self.cfg.page_size, self.cfg.cp_size
        capacity = self.alloc.capacity_per_lane
        while self.waiting and len(self.running) + len(self.decoding) < self.cfg.max_running:
            req = self.waiting[0]
            total = req.input_length + (req.output_length if self.cfg.colocated_decode else 0)
            pages = -(-total // P)
            if pages > capacity.sum() or int(zigzag_lane_pages(pages, 0, C).max()) > capacity.min():
                self.waiting.popleft()
                self.rejections[req.req_id] = (
                    f"needs {pages} pages but the pool has {int(capacity.sum())} "
                    f"({int(capacity.min())} on its smallest lane)"
                )
                continue
            reserved = sum(-(-(r.remaining + self._decode_left(r)) // P) + 1 for r in self.running + self.decoding)
            room = self.alloc.total_free_pages + int(self.cache.evictable_pages_per_lane().sum())
            if room - reserved < pages + 1 and (self.running or self.decoding):
                return  # wait for running requests to free pages
            self.waiting.popleft()
            self.running.append(self._start(req))

    def _decode_left(self, r: _Running) -> int:
        return r.req.output_length - r.decoded if self.cfg.colocated_decode else 0

    def _start(self, req: Request) -> _Running:
        tokens = prompt_token_ids(req)
        match = self.cache.match_prefix(tokens[:-1])  # at least one token is computed
        if match.host_len:
            match = self.cache.load_back(match)
        self.cache.lock(match.handle)
        slots = np.full(req.input_length + req.output_length, -1, dtype=_I64)
        slots[: match.device_len] = match.device_slots
        self.cache_hit_tokens += match.device_len
        return _Running(req, tokens, slots, match.device_len, match.handle)

    # ------------------------------------------------------------------------------------------ step
    def _step(self) -> bool:
        """Run one step; True when any request advanced (prefill or decode)."""
        batch, lens = self._form_batch()
        alloc = self._allocate(batch, lens)
        decode_tokens = self._decode_step() if self.decoding else None
        work = step_work(alloc.plan if alloc else None, self.cfg.cost, self.cfg.cp_size, decode_tokens)
        self.now_ms += self.cfg.cost.step_overhead_ms + float(work.max())
        if alloc is not None:
            self._advance(batch[: alloc.plan.num_requests], alloc)
        self.rec.record(self.now_ms, self.alloc.used_pages_per_lane(), work if alloc is not None else None)
        return alloc is not None or decode_tokens is not None

    def _form_batch(self) -> tuple[list[_Running], list[int]]:
        """Running requests in admission order with their chunk lengths, within ``max_batch_tokens``."""
        budget, batch, lens = self.cfg.max_batch_tokens, [], []
        for r in self.running:
            if budget <= 0:
                break
            n = min(r.remaining, self.cfg.chunk_size, budget)
            if n < r.remaining:
                n = self._align_chunk(r.done, n)
            batch.append(r)
            lens.append(n)
            budget -= n
        return batch, lens

    def _align_chunk(self, prefix_len: int, n: int) -> int:
        """CP-aware chunking: a chunk that does not finish its request ends where its new pages are a
        multiple of ``2 * cp_size`` (every zigzag segment equal), else on a page boundary, if it can.

        Example C=2, P=4, prefix 6, n=20: new pages start at 8; 8 + 16 = 24 <= 26 -> n = 18.
        """
        P, unit = self.cfg.page_size, 2 * self.cfg.cp_size * self.cfg.page_size
        first = -(-prefix_len // P) * P
        for step in (unit, P):
            end = first + (prefix_len + n - first) // step * step
            if end > prefix_len:
                return end - prefix_len
        return n

    def _allocate(self, batch: list[_Running], lens: list[int]):
        """Plan, check the MQA-logits budget, evict what the plan's lanes lack, allocate atomically.

        A refused allocation (a lane still short after eviction) counts in ``owner_lane_exhausted`` and
        drops the last request of the batch; the rest is retried in the same step.
        """
        limit = self.cfg.logits_budget_elements
        while batch:
            args = ([r.done for r in batch], lens[: len(batch)], [r.last_loc for r in batch])
            plan = self.alloc.plan_extend(*args)
            if limit is not None and len(batch) > 1 and int(mqa_logits_elements(plan).max()) > limit:
                self.logits_budget_cuts += 1
                batch = batch[:-1]
                continue
            while True:
                short = np.bincount(plan.page_owners, minlength=self.cfg.cp_size) - self.alloc.free_pages_per_lane()
                freed = sum(self.cache.evict(int(r), int(short[r])) for r in np.flatnonzero(short > 0))
                try:
                    return self.alloc.alloc_extend(*args)
                except LaneExhausted as e:
                    self.last_short_lane = e.lane
                    if freed == 0:  # nothing more to evict for this plan: refuse
                        break
                    plan = self.alloc.plan_extend(*args)  # balanced phases move with free pages
            self.owner_lane_exhausted += 1
            batch = batch[:-1]
        return None

    def _advance(self, batch: list[_Running], alloc) -> None:
        out = alloc.out_cache_loc.numpy()
        indptr = alloc.plan.extend_indptr
        page_indptr = alloc.plan.page_indptr
        for i, r in enumerate(batch):
            n = int(indptr[i + 1] - indptr[i])
            r.slots[r.done : r.done + n] = out[indptr[i] : indptr[i + 1]]
            r.own_pages.append(alloc.new_pages[page_indptr[i] : page_indptr[i + 1]])
            r.done += n
            self.prefill_tokens += n
            if r.remaining == 0:
                self.ttft_ms.append(self.now_ms - r.req.arrival_ms)
                self.running.remove(r)
                if self.cfg.colocated_decode and r.req.output_length > 0:
                    self.decoding.append(r)
                else:
                    self._finish(r)

    def _decode_step(self) -> np.ndarray | None:
        """One decode step of every decoding request: one token each (``alloc_decode``), or with
        ``spec_draft_tokens`` an MTP step (``SpecDecoder``: ``alloc_draft``, verify, ``release_tail``);
        tokens per rank (the verify pass's with MTP), or None."""
        batch = list(self.decoding)
        while batch:
            seq = [r.req.input_length + r.decoded for r in batch]
            lasts = [int(r.slots[s - 1]) for r, s in zip(batch, seq, strict=True)]
            try:
                a = self.spec.alloc_draft(seq, lasts) if self.spec else self.alloc.alloc_decode(seq, lasts)
            except LaneExhausted as e:
                self.last_short_lane = e.lane
                if self.cache.evict(e.lane, e.needed - e.available) == 0:
                    self.owner_lane_exhausted += 1
                    batch = batch[:-1]
                continue
            if self.spec:
                left = [r.req.output_length - r.decoded for r in batch]
                kept = self.spec.verify(a, [r.req.req_id for r in batch], seq, left, [r.slots for r in batch])
            else:
                out, ind = a.out_cache_loc.numpy(), a.plan.page_indptr
                kept = [(out[i : i + 1], a.new_pages[ind[i] : ind[i + 1]]) for i in range(len(batch))]
            for r, s, (slots, pages) in zip(batch, seq, kept, strict=True):
                r.slots[s : s + slots.shape[0]] = slots
                r.own_pages.append(pages)
                r.decoded += slots.shape[0]
                if r.decoded == r.req.output_length:
                    self.decoding.remove(r)
                    self._finish(r)
            return a.plan.per_rank_tokens
        return None

    def _leaked_pages(self) -> int:
        """Pages in use that neither the prefix cache nor a live request holds (0 unless pages leak)."""
        live = sum(p.shape[0] for r in self.running + self.decoding for p in r.own_pages)
        return int(self.alloc.used_pages_per_lane().sum() - self.cache.cached_pages_per_lane().sum()) - live

    def _finish(self, r: _Running) -> None:
        """Hand the prompt's full pages to the prefix cache, unlock the prefix, free the rest."""
        n = r.req.input_length
        res = self.cache.insert(r.token_ids, r.slots[:n])
        self.cache.unlock(r.handle)
        own = np.concatenate(r.own_pages) if r.own_pages else np.zeros(0, _I64)
        kept = np.concatenate([res.pages, res.duplicate_pages])
        self.alloc.free(np.setdiff1d(own, kept, assume_unique=True))
        self.finished += 1

    # --------------------------------------------------------------------------------------- results
    def _record_livelock(self, stalled: int) -> None:
        blocked = [r.req.req_id for r in self.running + self.decoding]
        self.livelock = {
            "lane": self.last_short_lane,
            "stalled_steps": stalled,
            "blocked_requests": blocked[:32],
            "blocked_count": len(blocked),
            "waiting_count": len(self.waiting),
            "free_pages_per_lane": self.alloc.free_pages_per_lane().tolist(),
            "owner_lane_exhausted": self.owner_lane_exhausted,
        }

    def _result(self, wall_s: float) -> PolicyResult:
        used = self.rec.used()
        counters = self.cache.counters()
        metrics = {
            "requests_total": len(self.requests),
            "requests_finished": self.finished,
            "requests_rejected": len(self.rejections),
            "prefill_tokens": self.prefill_tokens,
            "cache_hit_tokens": self.cache_hit_tokens,
            **lane_metrics(used, self.cfg.pages_per_lane),
            "compute_imbalance_mean": compute_imbalance_mean(self.rec.work()),
            "owner_lane_exhausted": self.owner_lane_exhausted,
            "load_back_owner_lane_capacity_failed": counters["load_back_owner_lane_capacity_failed"],
            "evicted_pages": int(sum(counters["evicted_pages"])),
            "livelock_detected": self.livelock is not None,
            "ttft_ms_p50": percentile_ms(self.ttft_ms, 50),
            "ttft_ms_p99": percentile_ms(self.ttft_ms, 99),
            "sim_wall_s": round(wall_s, 3),
            "steps": self.rec.num_steps,
            "sim_time_ms": self.now_ms,
            "logits_budget_cuts": self.logits_budget_cuts,
            "leaked_pages": self._leaked_pages(),
            **(self.spec.metrics() if self.spec else {}),
            "load_back_pages": counters["load_backs"],
            "host_backups": counters["backups"],
            "livelock": self.livelock,
            "rejections": {str(k): v for k, v in sorted(self.rejections.items())[:100]},
        }
        return PolicyResult(self.policy, metrics, self.rec.times(), used)
