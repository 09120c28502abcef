"""One policy's replay: a deterministic step loop over cpkv's real allocator and prefix cache.

Each step: running requests, oldest first, get the longest next chunk that fits the token budget, every
lane's free + evictable pages and the logits budget (``admission.StepBuilder``); then waiting requests
are admitted in arrival order (prefix match, host load-back on the recorded lanes, lock) while the pool
can still finish every admitted request and the newcomer's first chunk fits this step; the batch is
allocated atomically (evicting what each lane lacks), time advances by the cost model, and finished
requests hand their pages to the prefix cache. Nothing here re-implements planning or allocation: the
simulator drives the library exactly as an engine's scheduler would.

Progress: under ``balanced`` the oldest request can always take a page somewhere while the reservation
holds; a request that cannot run even alone (its next page's or MTP step's lane full of its own pages, or
its prompt's last token alone over the logits budget) is rejected with a reason (``rejection.py``); decode steps
that block each other retract the youngest decoding request. What remains, prefilling requests blocked
by each other's pages (``legacy`` piling every page on lane 0), is a livelock: a finding in the report.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from ..cache.flow import RequestFlow
from ..errors import LaneExhausted
from ..plan import BatchPlan
from .admission import Fit, StepBuilder
from .config import SimConfig
from .cost import step_cost
from .counters import ReplayCounters
from .metrics import StepRecorder, livelock_finding, policy_metrics
from .rejection import Rejection, budget_reason, lane_reason, pool_reason
from .report import PolicyResult
from .reservation import pages_to_finish, reservation_short, stuck_alone
from .running import RunningRequest
from .spec_decode import SpecDecoder
from .storage import OWNER_LANE, build_storage
from .trace import Request, TraceStream, prompt_token_ids

_I64 = np.int64


GC_GEN0_THRESHOLD = 100_000
"""Allocations between two young-generation collections during a replay (CPython's default: 700): the step
loop makes millions of short-lived objects and few reference cycles (benchmarks/README.md)."""


@contextmanager
def _rare_collections() -> Iterator[None]:
    """Raise the garbage collector's young-generation threshold for the block, then restore it."""
    old = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


class PolicyRun:
    """State of one policy's replay (``counters``, a ``ReplayCounters``, are per run; nothing is global).

    Args:
        config: the ``SimConfig``. policy: ``rotation`` | ``legacy`` | ``balanced``.
        requests: the workload, in arrival order: a sequence, or a stream (``trace.TraceStream``) that ``run``
            iterates once, taking each request when its arrival comes due; ``len`` counts them for the metrics.
        cost: the ``cpkv.cost.StepCost`` that prices each step (default: ``step_cost(config)``).
        kv_storage: the KV storage design (``sim.storage``, C-STORAGE; owner policies place owner-lane's pages).
    """

    def __init__(
        self,
        config: SimConfig,
        policy: str,
        requests: Sequence[Request] | TraceStream,
        cost=None,
        kv_storage: str = OWNER_LANE,
    ) -> None:
        self.cfg = config
        self.cost = step_cost(config) if cost is None else cost
        self.requests = requests
        self.storage = build_storage(
            kv_storage, config, policy, self.cost
        )  # C-STORAGE: allocator, cache, traffic
        self.alloc, self.cache, self.policy = self.storage.alloc, self.storage.cache, self.storage.policy
        self.drafts = (
            SpecDecoder(self.alloc, config.spec_draft_tokens, config.spec_accept_rate, config.seed)
            if config.spec_draft_tokens
            else None
        )
        self.builder = StepBuilder(config, self.alloc, self.cache)
        k = max(1, config.spec_draft_tokens)  # KV slots per decoding request and step
        decode = replace(config, chunk_size=k, max_batch_tokens=k * config.max_running, logits_budget_mb=0.0)
        self.decode_builder = StepBuilder(decode, self.alloc, self.cache, whole=True)  # k slots or none
        self.rec = StepRecorder(config.cp_size)
        self.now_ms = 0.0
        self.waiting: list[Request] = []  # arrived, not admitted, in arrival order
        self.running: list[RunningRequest] = []
        self.decoding: list[RunningRequest] = []
        self.counters = ReplayCounters(len(requests))
        self._redo: dict[int, int] = {}  # req_id -> output tokens a retracted request had emitted
        self._hold_admission = False  # after a retraction, until an admitted request advances
        self._tokens: dict[int, np.ndarray] = {}  # token ids of waiting requests already tried
        self.flow = RequestFlow(self.alloc, self.cache)

    # --------------------------------------------------------------------------------------------- run
    def run(self, on_progress: Callable[[int], None] | None = None) -> PolicyResult:
        """Replay every request; returns the ``PolicyResult`` (metrics of docs/metrics.md + timeline)."""
        t0 = time.perf_counter()
        with _rare_collections():
            self._loop(on_progress)
        return self._result(time.perf_counter() - t0)

    def _loop(self, on_progress: Callable[[int], None] | None) -> None:
        arrivals = iter(self.requests)  # read as arrivals come due: one request ahead of the clock, never all
        arrival = next(arrivals, None)
        stalled = 0
        c = self.counters
        while arrival is not None or self.waiting or self.running or self.decoding:
            if (
                not (self.waiting or self.running or self.decoding)
                and arrival is not None
                and arrival.arrival_ms > self.now_ms
            ):
                self.now_ms = arrival.arrival_ms  # idle until the next arrival
            while arrival is not None and arrival.arrival_ms <= self.now_ms:
                self.waiting.append(arrival)
                arrival = next(arrivals, None)
            before = c.finished + len(c.rejections), c.retractions
            progressed = self._step()
            if on_progress is not None and c.finished + len(c.rejections) != before[0]:
                on_progress(c.finished + len(c.rejections))
            if progressed or c.finished + len(c.rejections) != before[0]:
                stalled = 0
            elif c.retractions == before[1]:  # a retraction is neither progress nor a stall
                stalled += 1
            if stalled >= self.cfg.livelock_steps:
                blocked = [r.req.req_id for r in self.running + self.decoding]
                free = self.alloc.free_pages_per_lane()
                c.livelock = livelock_finding(c, blocked, len(self.waiting), free, stalled)
                break

    # ------------------------------------------------------------------------------------------ step
    def _step(self) -> bool:
        """Run one step; True when any request advanced (prefill or decode)."""
        b = self.builder
        b.reset()
        for fit in b.add_many([(r, r.kv.length, r.remaining, r.kv.last_loc) for r in self.running]):
            self._note(fit)  # (a prompt whose last token alone is over the logits budget was never admitted)
        self._admit()
        batch = b.commit()
        decode = self._decode_step() if self.decoding else None
        work = self.cost.step_work(batch[1].plan if batch else None, decode)
        kv_ms = self.storage.step_traffic([r.slots for r in batch[0]], batch[1]) if batch is not None else 0.0
        self.now_ms += self.cost.overhead_ms + float(work.max()) + kv_ms
        if batch is not None:
            self.counters.logits_peak = max(self.counters.logits_peak, int(batch[2].max()))
            self._advance(*batch[:2])
        elif decode is None and (self.running or self.decoding):
            self._unblock(min(self.running + self.decoding, key=lambda r: r.req.req_id))
        self.rec.record(self.now_ms, self.storage.used_pages_per_rank(), work if batch is not None else None)
        if batch is not None or decode is not None:
            self._hold_admission = False
            return True
        return False

    def _note(self, fit: Fit) -> Fit:
        """Count what cut a chunk: the logits budget, or a lane without free or evictable pages."""
        if fit.cut == "logits_budget":
            self.counters.logits_budget_cuts += 1
        elif fit.cut == "lane" and not fit.tokens:
            self.counters.owner_lane_exhausted += 1
            self.counters.last_short_lane = fit.lane
        return fit

    # ------------------------------------------------------------------------------------- admission
    def _admit(self) -> None:
        """Admission in arrival order while the pool can finish every admitted request and the newcomer's
        first chunk fits this step. A request short of room in total stops admission (FCFS); one held back
        only by a lane lets the requests behind it try (their pages may go to other lanes)."""
        if self._hold_admission and (self.running or self.decoding):
            return  # the pages a retraction freed go to the admitted requests first
        P = self.storage.page_size
        usable = int(self.alloc.capacity_per_lane.sum())
        i = 0
        while i < len(self.waiting) and len(self.running) + len(self.decoding) < self.cfg.max_running:
            req = self.waiting[i]
            pages = -(-self._kv_tokens(req) // P)
            if pages > usable:
                self._drop_waiting(i, pool_reason(pages, usable))
                continue
            # C-BUDGET: one token at position p needs p + 1 elements (C-ESTIMATE), so a prompt whose last token
            # alone is over the budget can never finish: rejected now, before any of it is computed
            last = req.input_length + self._redo.get(req.req_id, 0) - 1  # its last prefill token's position
            if self.cfg.logits_budget_elements is not None and last + 1 > self.cfg.logits_budget_elements:
                self._drop_waiting(i, budget_reason(last, self.cfg.logits_budget_elements))
                continue
            if self.builder.tokens_left <= 0 or not self._total_room_for(req):
                return
            run = self._start(req)
            others = self.running + self.decoding
            pages_left = [self._pages_left(r) for r in (*others, run)]  # room: re-read by _start's lock
            short = reservation_short(pages_left, self.builder.room, per_lane=False)  # the total
            fit = (
                self._note(self.builder.add(run, run.kv.length, run.remaining, run.kv.last_loc))
                if not short
                else None
            )
            if fit is not None and fit.tokens and others and self.storage.per_lane_reservation:
                short = self._lane_reservation_short((*others, run))  # every lane, with the step as planned
                if short:
                    self.builder.drop_last()
                    fit = None
            if fit is not None and fit.tokens:
                del self.waiting[i]
                self._tokens.pop(req.req_id, None)
                self.running.append(run)
                self.counters.cache_hit_tokens += run.kv.length
                self.storage.admitted(run)
                continue
            run.kv.release()
            self.builder.refresh_room()
            if fit is not None and fit.cut == "lane" and not others:  # alone, and its chunk has no lane
                self._drop_waiting(
                    i,
                    lane_reason(
                        self.policy,
                        fit.lane,
                        int(self.alloc.capacity_per_lane[fit.lane]),
                        "its cached prefix",
                    ),
                )
            elif short == "lane" or (fit is not None and fit.cut == "lane"):
                i += 1
            else:
                return  # short of pages in total, or the step's token or logits budget is spent

    def _lane_reservation_short(self, admitted: Sequence[RunningRequest]) -> str | None:
        """``reservation_short`` per lane: the step's batch as planned, then every admitted request's later
        pages (its pages left after its chunk of this step) as even shares."""
        chunk = self.builder.chunks()
        P = self.storage.page_size
        left = [pages_to_finish(self._kv_tokens(r.req), r.kv.length + chunk.get(r, 0), P) for r in admitted]
        return reservation_short(left, self.builder.room, self.builder.placed_pages(), per_lane=True)

    def _total_room_for(self, req: Request) -> bool:
        """Whether the pool, in total, can take ``req`` besides what admitted requests still need (checked
        before any load-back, as an engine checks its token budget before ``load_back``)."""
        room = self.alloc.total_free_pages + int(self.cache.evictable_pages_per_lane().sum())
        room -= sum(self._pages_left(r) for r in self.running + self.decoding)
        kv, P = self._kv_tokens(req), self.storage.page_size
        if pages_to_finish(kv, 0, P) <= room:  # fits even with nothing cached: no need to match
            return True
        probe = self.cache.match_prefix(self._token_ids(req)[:-1], record=False)
        return pages_to_finish(kv, probe.device_len, P) <= room

    def _token_ids(self, req: Request) -> np.ndarray:
        tokens = self._tokens.get(req.req_id)
        if tokens is None:
            tokens = self._tokens[req.req_id] = prompt_token_ids(req)
        return tokens

    def _start(self, req: Request) -> RunningRequest:
        """Match the prompt (``load_back`` of a host-tier part on its recorded lanes) and lock the prefix."""
        tokens = self._token_ids(req)
        kv = self.flow.start(
            tokens[:-1], req.input_length + req.output_length
        )  # at least one token is computed
        self.builder.refresh_room()
        return RunningRequest(req, tokens, kv, redo=self._redo.get(req.req_id, 0))

    def _kv_tokens(self, req: Request) -> int:
        """KV slots ``req`` holds at its peak, the figure admission and reservations use: its prompt; with
        colocated decode its output too; with MTP also the K - 1 slots a draft step takes past its last
        token (C-DRAFT: K slots per step, the rejected tail released after verification)."""
        if not self.cfg.colocated_decode or req.output_length == 0:
            return req.input_length
        return req.input_length + req.output_length + (self.cfg.spec_draft_tokens - 1 if self.drafts else 0)

    def _pages_left(self, r: RunningRequest) -> int:
        return pages_to_finish(self._kv_tokens(r.req), r.kv.length, self.storage.page_size)

    # --------------------------------------------------------------------------------------- advance
    def _advance(self, batch: list[RunningRequest], alloc) -> None:
        c = self.counters
        for i, r in enumerate(batch):
            c.prefill_tokens += r.kv.take(alloc, i)
            if r.remaining == 0:
                if r.req.req_id in self._redo:  # retracted while decoding: its first token was out already
                    del self._redo[r.req.req_id]
                    r.decoded = r.redo  # the output positions it prefilled again
                else:
                    c.ttft_ms.append(self.now_ms - r.req.arrival_ms)
                self.running.remove(r)
                if self.cfg.colocated_decode and r.req.output_length > 0:
                    self.decoding.append(r)
                else:
                    self._retire(r, r.req.input_length)
                    c.finished += 1

    def _decode_step(self) -> BatchPlan | None:
        """One decode step of every decoding request whose slots fit: one token each (``alloc_extend`` with
        E=1, as ``alloc_decode``), or with ``spec_draft_tokens`` K an MTP step (``SpecDecoder``:
        ``alloc_draft``, verify, ``release_tail``). Sized like a prefill step (each request at its real
        batch position, all K slots or none; one whose pages have no lane waits). Returns the step's plan
        (its tokens per rank are the verify pass's with MTP), or None when none advanced."""
        b = self.decode_builder
        k = b.config.chunk_size
        seqs = [r.kv.length for r in self.decoding]  # its prompt and the output decoded so far
        lasts = [r.kv.last_loc for r in self.decoding]
        try:  # fast path: every request's slots fit in free pages (the builder would plan the same batch)
            batch = list(self.decoding)
            a = (
                self.drafts.alloc_draft(seqs, lasts)
                if self.drafts
                else self.alloc.alloc_extend(seqs, [k] * len(seqs), lasts)
            )
        except LaneExhausted:
            b.reset()
            for fit in b.add_many(
                [(r, s, k, last) for r, s, last in zip(self.decoding, seqs, lasts, strict=True)]
            ):
                self._note(fit)
            out = b.commit()
            if out is None:
                return None
            batch, a, _ = out
            if self.drafts:
                self.drafts.count_draft(a)
        seq = [r.kv.length for r in batch]
        kept = None  # all of each request's slots and pages, or with MTP what verification kept
        if self.drafts:
            left = [r.req.output_length - r.decoded for r in batch]
            kept = self.drafts.verify(a, [r.req.req_id for r in batch], seq, left, [r.slots for r in batch])
        for i, r in enumerate(batch):
            r.decoded += r.kv.take(a, i, *kept[i]) if kept else r.kv.take(a, i)
            if r.decoded == r.req.output_length:
                self.decoding.remove(r)
                self._retire(r, r.req.input_length)
                self.counters.finished += 1
        return a.plan

    def leaked_pages(self) -> int:
        """Pages in use that neither the prefix cache nor a live request holds (0 unless pages leak)."""
        live = sum(r.kv.num_own_pages for r in self.running + self.decoding)
        return int(self.alloc.used_pages_per_lane().sum() - self.cache.cached_pages_per_lane().sum()) - live

    def _retire(self, r: RunningRequest, n: int) -> None:
        """Hand the full pages of the first ``n`` prompt tokens to the prefix cache, unlock the matched
        prefix, free the request's other pages (the partial last page, decode pages)."""
        self.storage.retired(r, n)
        r.kv.finish(r.token_ids[:n])

    # ------------------------------------------------------------------------------------- rejection
    def _reject(self, r: RunningRequest, reason: Rejection) -> None:
        """Stop an admitted request for good: its computed prompt pages go to the cache, the rest is freed."""
        prefilling = r in self.running
        (self.running if prefilling else self.decoding).remove(r)
        self._retire(r, r.kv.length if prefilling else r.req.input_length)  # its positions with prompt KV
        self.counters.rejections[r.req.req_id] = reason
        self.builder.refresh_room()

    def _drop_waiting(self, i: int, reason: Rejection) -> None:
        req = self.waiting.pop(i)
        self._tokens.pop(req.req_id, None)
        self.counters.rejections[req.req_id] = reason

    def _unblock(self, oldest: RunningRequest) -> None:
        """In a step where nothing advanced: reject the oldest admitted request if it could not run even
        with every other page of the pool free (its policy puts its next chunk, or its decode step's
        slots, on a lane full of its own pages), else retract the youngest decoding request."""
        kv = oldest.kv.length  # tokens whose KV exists (prompt, then decode)
        held = np.unique(oldest.slots[:kv] // self.storage.page_size) if kv else np.zeros(0, _I64)
        last_page = int(oldest.slots[kv - 1]) // self.storage.page_size if kv else -1
        step = (
            self.decode_builder.config.chunk_size if oldest in self.decoding else 1
        )  # K slots, or one token
        lane = stuck_alone(self.storage.scratch_allocator(), held, kv, last_page, step)
        if lane >= 0:
            self._reject(
                oldest,
                lane_reason(self.policy, lane, int(self.alloc.capacity_per_lane[lane]), "its own pages"),
            )
        elif (
            self.decoding and len(self.running) + len(self.decoding) > 1
        ):  # alone, a retraction frees nothing
            self._retract(max(self.decoding, key=lambda r: r.req.req_id))

    def _retract(self, r: RunningRequest) -> None:
        """Retract a decoding request as an engine does when decode steps block each other (SGLang's
        ``retract_decode``): its matched prefix stays in the cache (unlocked), every page it allocated is
        freed, and it waits again in arrival order; re-admitted, it prefills its prompt's uncached part
        and the ``decoded`` tokens whose KV was dropped, then decodes the rest. Admission waits until an
        admitted request advances, so the freed pages go to the blocked ones."""
        self.decoding.remove(r)
        r.kv.release()
        self._redo[r.req.req_id] = r.decoded
        at = next((i for i, w in enumerate(self.waiting) if w.req_id > r.req.req_id), len(self.waiting))
        self.waiting.insert(at, r.req)
        self.counters.retractions += 1
        self._hold_admission = True
        self.builder.refresh_room()

    # --------------------------------------------------------------------------------------- results
    def _result(self, wall_s: float) -> PolicyResult:
        c = self.counters
        metrics = policy_metrics(
            self.cfg, c, self.rec, self.storage, self.drafts, self.leaked_pages(), wall_s
        )
        ttft = np.asarray(c.ttft_ms, dtype=np.float64)  # [finished requests], ms
        return PolicyResult(self.storage.label, metrics, self.rec.times(), self.rec.used(), ttft)
