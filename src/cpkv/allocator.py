"""Owner-lane paged allocator: per-lane free pages, atomic alloc_extend / alloc_decode (SPEC section 7).

Implements C-ALLOC, C-ATOMIC, C-FAIL-FAST and the ``balanced`` policy of C-BALANCED. Pure CPU state
(numpy); only ``out_cache_loc`` is a torch tensor, on the allocator's device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .config import CPConfig, check_int
from .errors import AllocatorError, ConfigError, LaneExhausted, PlanError
from .planner import BatchPlan, _as_int_array, _lengths, plan_batch, zigzag_lane_pages

_I64 = np.int64


@dataclass(frozen=True, eq=False)
class ExtendAllocation:
    """Result of ``alloc_extend`` / ``alloc_decode`` (SPEC section 10).

    Attributes:
        out_cache_loc: ``[sum E]`` torch.int64 on the allocator's device: the slot of every extend token,
            flattened in request order (head tokens ``last_loc+1 ...``, then ``p*P + 0 .. P-1`` per new page).
        plan: the ``BatchPlan`` the pages were allocated for (phases as the policy chose them).
        new_pages: ``[sum m]`` int64 numpy page ids, flat, request order (``plan.page_owners`` order).
    """

    out_cache_loc: torch.Tensor
    plan: BatchPlan
    new_pages: np.ndarray


class OwnerLaneAllocator:
    """Per-lane free pages of one CP group's paged KV pool (SPEC C-ALLOC, C-ATOMIC, C-FAIL-FAST).

    Page p lives on lane ``p % C``; lane r holds pages ``r, r + C, ..., r + (Q_r - 1) * C``. Page 0 is
    reserved for padding writes and never handed out. A fresh allocator hands out the lowest ids of each
    lane first; the same call sequence always yields the same pages (every rank replays it).

    Args:
        config: ``CPConfig`` (cp_size, page_size, owner_policy; ``balanced`` picks phases here).
        pages_per_lane: pages per lane (one int Q >= 1), or a sequence of C ints when ranks have unequal
            free memory; global page ids run over ``0 .. C * max(Q_r) - 1``.
        device: torch device of ``out_cache_loc`` (default ``"cpu"``).

    Raises:
        ConfigError: a capacity below 1 or a list whose length is not ``cp_size``.
    """

    def __init__(self, config: CPConfig, pages_per_lane: int | Sequence[int], device="cpu") -> None:
        if not isinstance(config, CPConfig):
            raise ConfigError(f"config must be a CPConfig, got {type(config).__name__}")
        C = config.cp_size
        if isinstance(pages_per_lane, (int, np.integer)) and not isinstance(pages_per_lane, bool):
            caps = [check_int("pages_per_lane", pages_per_lane, 1)] * C
        else:
            caps = [check_int(f"pages_per_lane[{r}]", q, 1) for r, q in enumerate(pages_per_lane)]
            if len(caps) != C:
                raise ConfigError(f"pages_per_lane has {len(caps)} entries, cp_size={C} needs {C}")
        self.config = config
        self.device = torch.device(device)
        self.lane_pages = np.asarray(caps, dtype=_I64)  # [C] Q_r, page 0 included
        self.pages_per_lane = int(self.lane_pages.max())  # Q of the shared layout
        self.num_pages = C * self.pages_per_lane
        # Per-lane stacks of free local indices (page = local * C + lane); the top is the end.
        # Fresh: descending, so the lowest ids come off first. Lane 0 never holds local 0 (page 0).
        self._stack = [np.arange(q - 1, -1 if r else 0, -1, dtype=_I64) for r, q in enumerate(caps)]
        self._top = np.asarray([s.shape[0] for s in self._stack], dtype=_I64)  # [C] free pages
        self._free = np.zeros(self.num_pages, dtype=bool)
        for r, q in enumerate(caps):
            self._free[np.arange(q, dtype=_I64) * C + r] = True
        self._free[0] = False
        self.capacity_per_lane = self._top.copy()  # [C] usable pages

    # ----------------------------------------------------------------------------------------- queries
    def free_pages_per_lane(self) -> np.ndarray:
        """Free pages of each lane, int64 ``[C]`` (a copy)."""
        return self._top.copy()

    def used_pages_per_lane(self) -> np.ndarray:
        """Pages handed out and not yet freed, per lane, int64 ``[C]``."""
        return self.capacity_per_lane - self._top

    @property
    def min_free_pages(self) -> int:
        """Free pages of the emptiest-by-capacity lane, ``min(free_pages_per_lane())``, in pages."""
        return int(self._top.min())

    @property
    def total_free_pages(self) -> int:
        """Free pages over all lanes, in pages."""
        return int(self._top.sum())

    def is_free(self, pages) -> np.ndarray:
        """Bool ``[n]``: whether each page id is currently free (ids must be in ``[0, num_pages)``)."""
        pages = self._pages_array(pages)
        return self._free[pages]

    def state_digest(self) -> str:
        """SHA-256 hex of the full free-list state; equal on every rank that replayed the same calls."""
        h = hashlib.sha256(self._top.tobytes())
        for r, stack in enumerate(self._stack):
            h.update(stack[: self._top[r]].tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------------------------------- allocation
    def alloc_pages(self, owners) -> np.ndarray:
        """One page of each requested lane, in order (SPEC C-ALLOC), atomically (C-ATOMIC).

        Args:
            owners: ``[n]`` lanes in ``[0, C)`` (ints; list, numpy or CPU tensor).

        Returns:
            ``[n]`` int64 page ids, ``page % C == owners``.

        Raises:
            AllocatorError: an owner out of range. LaneExhausted: a lane has fewer free pages than the
                call needs; nothing is allocated.
        """
        owners = self._lanes_array(owners)
        counts = np.bincount(owners, minlength=self.config.cp_size)
        self._check_counts(counts)
        return self._take(owners, counts)

    def alloc_extend(self, prefix_lens, extend_lens, last_locs) -> ExtendAllocation:
        """Plan a batch and allocate all its new pages at once (SPEC section 7, C-ATOMIC, C-FAIL-FAST).

        Head owners come from ``lane(last_loc // P)``. Under ``balanced`` each request's phase is the lane
        with the most free pages after the earlier requests of the batch took theirs (ties: lowest lane).

        Args:
            prefix_lens: ``[B]`` tokens already cached (ints >= 0).
            extend_lens: ``[B]`` new tokens (ints >= 0).
            last_locs: ``[B]`` slot of position ``prefix_len - 1``, -1 when ``prefix_len == 0``.

        Returns:
            ``ExtendAllocation``; e.g. C=4, P=64, Q=8, fresh, ``L0=0, E=1000``: new pages
            ``[4,8,1,5,2,6,3,7,11,15,10,14,9,13,12,16]``, ``out_cache_loc`` starts ``256..319, 512..575``.

        Raises:
            PlanError: bad lengths or mismatched arrays. AllocatorError: a ``last_loc`` inconsistent with
                its ``prefix_len`` (``(last_loc + 1) % P != prefix_len % P``), out of range, or on a free
                page. LaneExhausted: a lane is short. In every case nothing is allocated.
        """
        plan, last = self._plan_extend(prefix_lens, extend_lens, last_locs)
        counts = np.bincount(plan.page_owners, minlength=self.config.cp_size)
        self._check_counts(counts)
        new_pages = self._take(plan.page_owners, counts)
        runs, P = plan.token_runs, self.config.page_size
        run_start = np.empty(runs.length.shape[0], dtype=_I64)
        run_start[~runs.is_page] = last + 1  # head tokens continue the last prefix page
        run_start[runs.is_page] = new_pages * P
        out = torch.from_numpy(runs.expand(run_start)).to(self.device)
        new_pages.setflags(write=False)
        return ExtendAllocation(out_cache_loc=out, plan=plan, new_pages=new_pages)

    def plan_extend(self, prefix_lens, extend_lens, last_locs) -> BatchPlan:
        """The plan ``alloc_extend`` would allocate now, without taking any page (plan, then commit).

        Validates ``last_locs`` and derives head owners as ``alloc_extend`` does; under ``balanced`` the
        phases reflect the current free pages. A scheduler checks budgets on it (e.g.
        ``mqa_logits_elements``) before calling ``alloc_extend`` with the same arguments, which yields the
        same plan while no other call intervenes.

        Raises:
            PlanError, AllocatorError, UnsupportedPagePlan: as ``alloc_extend``; nothing changes.
        """
        return self._plan_extend(prefix_lens, extend_lens, last_locs)[0]

    def alloc_decode(self, seq_lens, last_locs) -> ExtendAllocation:
        """Append one token per request: ``alloc_extend(seq_lens, [1] * B, last_locs)`` (SPEC section 7).

        A new page is taken only when position ``seq_len`` starts a page, on the lane given by C-PHASE
        (so decode and speculative-draft pages rotate too). Raises as ``alloc_extend``.
        """
        L0 = _as_int_array("seq_lens", seq_lens, None)
        return self.alloc_extend(L0, np.ones_like(L0), last_locs)

    def free(self, pages) -> None:
        """Return pages to their lanes (SPEC C-ALLOC); all-or-nothing.

        Args:
            pages: ``[n]`` page ids (ints; list, numpy or CPU tensor).

        Raises:
            AllocatorError: page 0, an id out of range or beyond its lane's capacity, a page already
                free, or a page listed twice; nothing is freed.
        """
        pages = self._pages_array(pages)
        if pages.size == 0:
            return
        C = self.config.cp_size
        bad = pages[pages == 0]
        if bad.size:
            raise AllocatorError("cannot free page 0: it is reserved for padding writes")
        bad = pages[~self._held(pages)]
        if bad.size:
            p = int(bad[0])
            why = "it is already free (double free)" if self._free[p] else f"beyond lane {p % C}'s capacity"
            raise AllocatorError(f"cannot free page {p}: {why}")
        uniq, cnt = np.unique(pages, return_counts=True)
        if (cnt > 1).any():
            raise AllocatorError(f"cannot free page {int(uniq[cnt > 1][0])}: listed more than once")
        lanes = pages % C
        for r in np.unique(lanes):
            local = pages[lanes == r] // C
            top = self._top[r]
            self._stack[r][top : top + local.shape[0]] = local[::-1]
            self._top[r] = top + local.shape[0]
        self._free[pages] = True

    # ---------------------------------------------------------------------------------------- private
    def _held(self, pages: np.ndarray) -> np.ndarray:
        """Bool ``[n]``: page is handed out (exists on its lane and is not free); page 0 never is."""
        C = self.config.cp_size
        return ~self._free[pages] & (pages // C < self.lane_pages[pages % C]) & (pages != 0)

    def _pages_array(self, pages) -> np.ndarray:
        try:
            arr = _as_int_array("pages", pages, None)
        except PlanError as e:
            raise AllocatorError(str(e)) from None
        bad = arr[(arr < 0) | (arr >= self.num_pages)]
        if bad.size:
            raise AllocatorError(f"page id {int(bad[0])} out of range [0, {self.num_pages})")
        return arr

    def _lanes_array(self, owners) -> np.ndarray:
        try:
            arr = _as_int_array("owners", owners, None)
        except PlanError as e:
            raise AllocatorError(str(e)) from None
        bad = np.flatnonzero((arr < 0) | (arr >= self.config.cp_size))
        if bad.size:
            i = int(bad[0])
            raise AllocatorError(f"owners[{i}]={int(arr[i])} out of range [0, {self.config.cp_size})")
        return arr

    def _plan_extend(self, prefix_lens, extend_lens, last_locs) -> tuple[BatchPlan, np.ndarray]:
        L0, E = _lengths(prefix_lens, extend_lens)
        last = _as_int_array("last_locs", last_locs, L0.shape[0])
        head = self._head_owners(L0, last)
        phases = self._balanced_phases(L0, E) if self.config.owner_policy == "balanced" else None
        return plan_batch(L0, E, self.config, head_owners=head, phases=phases), last

    def _head_owners(self, L0: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Validate ``last_locs`` against ``prefix_lens`` (C-FAIL-FAST) and return lanes (-1: none)."""
        P, C = self.config.page_size, self.config.cp_size
        none = L0 <= 0
        bad = np.flatnonzero(none & (last != -1))
        if bad.size:
            i = int(bad[0])
            raise AllocatorError(f"request {i}: prefix_len={int(L0[i])} needs last_loc=-1, got {int(last[i])}")
        has = ~none
        bad = np.flatnonzero(has & ((last < P) | (last >= self.num_pages * P)))
        if bad.size:
            i = int(bad[0])
            raise AllocatorError(
                f"request {i}: last_loc={int(last[i])} out of range [{P}, {self.num_pages * P}) "
                f"for prefix_len={int(L0[i])}"
            )
        bad = np.flatnonzero(has & ((last + 1) % P != L0 % P))
        if bad.size:
            i = int(bad[0])
            raise AllocatorError(
                f"request {i}: last_loc={int(last[i])} is inconsistent with prefix_len={int(L0[i])}: "
                f"(last_loc + 1) % {P} = {(int(last[i]) + 1) % P} but prefix_len % {P} = {int(L0[i]) % P}"
            )
        page = np.where(has, last // P, 0)
        bad = np.flatnonzero(has & ~self._held(page))
        if bad.size:
            i = int(bad[0])
            p = int(page[i])
            why = "is free" if self._free[p] else f"does not exist (lane {p % C} holds {self.lane_pages[p % C]} pages)"
            raise AllocatorError(f"request {i}: last_loc={int(last[i])} lies on page {p}, which {why}")
        return np.where(has, page % C, -1)

    def _balanced_phases(self, L0: np.ndarray, E: np.ndarray) -> np.ndarray:
        """C-BALANCED: phase of each request = lane with the most free pages left (ties: lowest lane)."""
        P, C = self.config.page_size, self.config.cp_size
        m = -(-(L0 + E) // P) - -(-L0 // P)
        free = self._top.copy()
        phases = np.empty(L0.shape[0], dtype=_I64)
        for i in range(L0.shape[0]):
            phases[i] = int(np.argmax(free))  # argmax returns the first (lowest) maximal lane
            free -= zigzag_lane_pages(int(m[i]), int(phases[i]), C)
        return phases

    def _check_counts(self, counts: np.ndarray) -> None:
        short = np.flatnonzero(counts > self._top)
        if short.size:
            r = int(short[0])
            raise LaneExhausted(r, int(counts[r]), int(self._top[r]))

    def _take(self, owners: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Pop ``counts[r]`` pages of every lane and scatter them to ``owners`` order (checked first)."""
        C = self.config.cp_size
        out = np.empty(owners.shape[0], dtype=_I64)
        if owners.shape[0] == 0:
            return out
        key = owners.astype(np.int16) if C <= np.iinfo(np.int16).max else owners
        order = np.argsort(key, kind="stable")
        start = 0
        for r in np.flatnonzero(counts):  # only lanes that give pages: cost independent of cp_size
            k, top = int(counts[r]), int(self._top[r])
            out[order[start : start + k]] = self._stack[r][top - k : top][::-1] * C + r
            self._top[r] = top - k
            start += k
        self._free[out] = False
        return out
