"""Replicated scheduler: every rank replays rank 0's allocator and prefix-cache decisions.

No page id is ever broadcast. Every rank builds the same ``OwnerLaneAllocator`` and ``PrefixCache`` and
makes the same calls in the same order on the same workload, so every rank holds the same
``out_cache_loc``, ``req_to_token`` rows and plans (SPEC C-ALLOC: the same call sequence yields the same
pages). ``digest()`` summarises that state; the executor's debug mode all-gathers it to prove it.

Decode (``hold_prompts``): a request whose prompt is done stays allocated and locked; the case decodes it
(``schedule_decode``, one ``alloc_decode`` slot per request and step) and then ``release``s it. Those
three, marked "decode" below, are the whole of the decode lifecycle here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..allocator import ExtendAllocation, OwnerLaneAllocator
from ..cache import PrefixCache
from ..cache.flow import RequestFlow, RequestKV
from ..config import CPConfig
from ..errors import LaneExhausted, PlanError
from .workload import Workload

_I64 = np.int64


@dataclass(frozen=True, eq=False)
class ForwardBatch:
    """One forward's schedule, identical on every rank.

    Attributes:
        index: forward number in the workload.
        request_ids: ``[B]`` int64 request ids in batch order.
        alloc: the ``ExtendAllocation`` (``plan``, ``out_cache_loc [N]`` torch.int64, ``new_pages``).
        token_ids: ``[N]`` torch.int64 token ids of the extend tokens, flat (request order).
        positions: ``[N]`` torch.int64 global position of each extend token in its request.
        token_req: ``[N]`` int64 numpy batch index of each extend token.
        kv_slots: per request ``[L0 + E]`` torch.int64 slots of positions ``0 .. L0+E-1`` (prefix, then
            this forward's tokens): the keys its queries read.
    """

    index: int
    request_ids: np.ndarray
    alloc: ExtendAllocation
    token_ids: torch.Tensor
    positions: torch.Tensor
    token_req: np.ndarray
    kv_slots: tuple[torch.Tensor, ...]

    @property
    def out_cache_loc(self) -> torch.Tensor:
        """``[N]`` torch.int64 slot of every extend token, flat (SPEC section 2)."""
        return self.alloc.out_cache_loc


class ReplicatedScheduler:
    """Allocator, prefix cache and ``req_to_token`` of one CP group; the same on every rank.

    Args:
        config: the group's ``CPConfig`` (cp_size, page_size, owner_policy).
        pages_per_lane: pages per lane, one int Q or C ints (unequal lanes; ``OwnerLaneAllocator``).
        workload: the requests and forwards.
        prefix_cache: whether requests share pages through a ``PrefixCache`` (match on a request's
            first forward, insert after each forward).
        host_pages_per_lane: host-tier capacity of the cache (0: evicted pages are dropped).
        backup_fn, restore_fn: the cache's host-tier hooks (see ``PrefixCache``); the executor passes
            functions that copy a page's rows on its owner rank only.
        device: torch device of the slot tensors.
        hold_prompts: keep a request whose prompt is done (for decode steps) instead of releasing it;
            ``take_prompt_done`` lists them, ``release`` ends them.
    """

    def __init__(
        self,
        config: CPConfig,
        pages_per_lane: int | Sequence[int],
        workload: Workload,
        *,
        prefix_cache: bool = True,
        host_pages_per_lane: int = 0,
        backup_fn=None,
        restore_fn=None,
        device: str | torch.device = "cpu",
        hold_prompts: bool = False,
    ) -> None:
        self.config = config
        self.workload = workload
        self.device = torch.device(device)
        self.allocator = OwnerLaneAllocator(config, pages_per_lane, device=self.device)
        self.cache = (
            PrefixCache(
                self.allocator,
                host_pages_per_lane=host_pages_per_lane,
                backup_fn=backup_fn,
                restore_fn=restore_fn,
            )
            if prefix_cache
            else None
        )
        self.flow = RequestFlow(self.allocator, self.cache)
        self.kv: dict[int, RequestKV] = {}  # request id -> its KV (req_to_token row, lock, own pages)
        self.cache_hit_tokens: dict[int, int] = {}  # request id -> tokens matched on its first forward
        self.hold_prompts = hold_prompts
        self.generated: dict[int, list[int]] = {}  # decode: request id -> tokens fed so far
        self._held: set[int] = set()  # held requests whose prompt is done
        self._prompt_done: list[int] = []

    @property
    def req_to_token(self) -> dict[int, np.ndarray]:
        """Request id -> ``[len]`` int64 slots of the positions with KV, for every live request (views)."""
        return {rid: kv.row for rid, kv in self.kv.items()}

    # -------------------------------------------------------------------------------------- schedule
    def schedule(self, index: int) -> ForwardBatch:
        """Plan and allocate forward ``index``; the allocation itself is atomic (C-ATOMIC).

        A request seen for the first time matches the prefix cache on ``token_ids[:end-1]`` (so it
        computes at least one token), loading host-only pages back on their recorded lanes. When a lane
        is short, the cache evicts on that lane and allocation is retried (at most ``cp_size`` times).

        Raises:
            PlanError: an ``end`` at or before what the request already holds, or past its tokens.
            LaneExhausted: a lane is still short after eviction.
        """
        if index in self.workload.flush_before and self.cache is not None:
            self.flush_cache()
        step = self.workload.forwards[index]
        for rid, end in step:
            if rid not in self.kv:
                self._start(rid, end)
        rids = np.asarray([rid for rid, _ in step], dtype=_I64)
        L0 = np.asarray([self.kv[rid].length for rid, _ in step], dtype=_I64)
        ends = np.asarray([end for _, end in step], dtype=_I64)
        for rid, l0, end in zip(rids.tolist(), L0.tolist(), ends.tolist(), strict=True):
            if not l0 < end <= len(self.workload.requests[rid]):
                raise PlanError(
                    f"forward {index}: request {rid} holds {l0} tokens, cannot advance to end={end} "
                    f"(it has {len(self.workload.requests[rid])} tokens)"
                )
        last = np.asarray([self.kv[x].last_loc for x in rids.tolist()], _I64)
        alloc = self._alloc(L0, ends - L0, last)
        loc = alloc.out_cache_loc.cpu().numpy()  # one copy from the device for the batch
        slots, tokens, positions = [], [], []
        for i, rid in enumerate(rids.tolist()):
            kv = self.kv[rid]
            kv.take(alloc, i, host_slots=loc)
            slots.append(torch.from_numpy(kv.row.copy()).to(self.device))
            tokens.append(np.asarray(self.workload.requests[rid][L0[i] : ends[i]], dtype=_I64))
            positions.append(np.arange(L0[i], ends[i], dtype=_I64))
        return ForwardBatch(
            index=index,
            request_ids=rids,
            alloc=alloc,
            token_ids=torch.from_numpy(np.concatenate(tokens)).to(self.device),
            positions=torch.from_numpy(np.concatenate(positions)).to(self.device),
            token_req=np.repeat(np.arange(rids.shape[0], dtype=_I64), ends - L0),
            kv_slots=tuple(slots),
        )

    def finish(self, batch: ForwardBatch) -> None:
        """After a forward: hand full pages to the prefix cache; release finished requests' pages."""
        for rid in batch.request_ids.tolist():
            kv = self.kv[rid]
            kv.share(self.workload.requests[rid][: kv.length])  # held through the new lock
            if kv.length < len(self.workload.requests[rid]):
                continue
            if self.hold_prompts:  # decode: kept, with its lock and its partial last page
                self._held.add(rid)
                self._prompt_done.append(rid)
            else:
                kv.release()
                del self.kv[rid]

    # ------------------------------------------------------------------------------------------ decode
    def take_prompt_done(self) -> list[int]:
        """Decode: the held requests whose prompt finished since the last call, in finishing order."""
        done, self._prompt_done = self._prompt_done, []
        return done

    def schedule_decode(self, index: int, request_ids: Sequence[int], tokens: Sequence[int]) -> ForwardBatch:
        """Decode: one step of held requests, token ``tokens[i]`` appended to request ``request_ids[i]``.

        Each request gets one slot from ``alloc_decode`` (a new page only when the position starts one, on
        the lane the policy gives; its owner computes the token, C-OWNER-EQ-COMPUTE), evicting on a short
        lane as ``schedule`` does.

        Raises:
            LaneExhausted: a lane is still short after eviction. PlanError: a request that is not held.
        """
        rids = np.asarray(request_ids, dtype=_I64)
        for rid in rids.tolist():
            if rid not in self._held:
                raise PlanError(
                    f"decode step {index}: request {rid} is not a held request whose prompt is done"
                )
        kvs = [self.kv[rid] for rid in rids.tolist()]
        seq = np.asarray([kv.length for kv in kvs], dtype=_I64)
        alloc = self._alloc(seq, None, np.asarray([kv.last_loc for kv in kvs], dtype=_I64))
        loc = alloc.out_cache_loc.cpu().numpy()  # one copy from the device for the batch
        slots = []
        for i, (rid, kv) in enumerate(zip(rids.tolist(), kvs, strict=True)):
            kv.take(alloc, i, host_slots=loc)
            self.generated.setdefault(rid, []).append(int(tokens[i]))
            slots.append(torch.from_numpy(kv.row.copy()).to(self.device))
        return ForwardBatch(
            index=index,
            request_ids=rids,
            alloc=alloc,
            token_ids=torch.as_tensor(np.asarray(tokens, dtype=_I64)).to(self.device),
            positions=torch.from_numpy(seq).to(self.device),
            token_req=np.arange(rids.shape[0], dtype=_I64),
            kv_slots=tuple(slots),
        )

    def release(self, rid: int) -> None:
        """Decode: end a held request: unlock its cache handle and free the pages it holds on its own."""
        self._held.discard(rid)
        self.kv.pop(rid).release()

    # ------------------------------------------------------------------------------------------- cache
    def flush_cache(self) -> None:
        """Evict every unlocked cached page of every lane (to the host tier where it has room)."""
        assert self.cache is not None
        for lane in range(self.config.cp_size):
            self.cache.evict(lane, int(self.cache.evictable_pages_per_lane()[lane]))

    def digest(self) -> str:
        """SHA-256 of allocator state, every ``req_to_token`` row and the cache's entries (replica check)."""
        h = hashlib.sha256(self.allocator.state_digest().encode())
        for rid in sorted(self.kv):
            h.update(np.int64(rid).tobytes() + self.kv[rid].row.tobytes())
        for rid in sorted(self.generated):  # decode: the tokens every rank chose from the gathered hidden
            h.update(np.int64(rid).tobytes() + np.asarray(self.generated[rid], dtype=_I64).tobytes())
        if self.cache is not None:
            h.update(repr(sorted(tuple(e[:5]) for e in self.cache.entries())).encode())
        return h.hexdigest()

    # ---------------------------------------------------------------------------------------- private
    def _start(self, rid: int, end: int) -> None:
        """First forward of ``rid``: its ``req_to_token`` row is the cache hit (page aligned) or empty."""
        tokens = np.asarray(self.workload.requests[rid], dtype=_I64)
        kv = self.kv[rid] = self.flow.start(
            tokens[: max(end - 1, 0)], tokens.shape[0]
        )  # decode grows the row
        self.cache_hit_tokens[rid] = kv.length

    def _alloc(self, L0: np.ndarray, E: np.ndarray | None, last: np.ndarray) -> ExtendAllocation:
        """``alloc_extend`` (``alloc_decode`` when ``E`` is None), evicting on a short lane and retrying."""

        def alloc() -> ExtendAllocation:
            if E is None:
                return self.allocator.alloc_decode(L0, last)
            return self.allocator.alloc_extend(L0, E, last)

        for _ in range(self.config.cp_size):
            try:
                return alloc()
            except LaneExhausted as e:
                if self.cache is None or self.cache.evict(e.lane, e.needed - e.available) == 0:
                    raise
        return alloc()
