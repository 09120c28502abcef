"""Chunk sizing and admission for one prefill step: the real per-lane footprint, the logits budget.

A step's batch is built one request at a time, oldest first. Each request gets the longest next chunk
that satisfies three limits at once:

1. the step's token budget (``max_batch_tokens``) and the request's own ``chunk_size``;
2. **pages**: the batch's plan, made by the group's allocator exactly as ``alloc_extend`` will place it
   (``plan_extend``: the policy in force, the request's real batch position, its head owner), needs on
   every lane no more than that lane's free plus evictable pages (``PrefixCache.evictable_pages_per_lane``);
3. **C-BUDGET**: every rank's MQA-logits estimate of the whole batch (C-ESTIMATE) stays within
   ``logits_budget_elements``.

Chunk lengths obey one alignment rule (``align_chunk``). When the wanted chunk does not fit, a binary
search over the raw length finds the longest aligned chunk that does (the estimate and, under a fixed
phase, the per-lane pages only grow with the chunk). A request left with no chunk waits for the next step
(the engine never admits one whose last prompt token alone exceeds the budget: one token at position p
needs p + 1 elements, so every other request's one-token chunk fits). ``commit`` evicts what each lane lacks and allocates; since the batch was sized
against free + evictable pages, the allocation cannot be refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..allocator import ExtendAllocation
from ..allocator.protocol import PageAllocator
from ..cache import PrefixCache
from ..estimator import mqa_logits_elements
from ..planner import BatchPlan
from .config import SimConfig
from .reservation import pages_to_finish

_I64 = np.int64


def align_chunk(
    prefix_len: int, n: int, remaining: int, cp_size: int, page_size: int, *, in_page: bool = True
) -> int:
    """The chunk of at most ``n`` tokens that a request with ``remaining`` tokens left runs, in tokens.

    A chunk that finishes the request (``n >= remaining``) is ``remaining``. Otherwise CP-aware chunking:
    the chunk ends where its new pages are a multiple of ``2 * cp_size`` (every zigzag segment equal), else
    on a page boundary, else (only when ``in_page``) after ``n`` tokens, inside a page; without
    ``in_page`` that last case gives 0 (no chunk: the next chunk would start with a head page, whose
    tokens all run on one rank). Non-decreasing in ``n``, so a binary search over ``n`` stays valid.
    Examples C=2, P=4, prefix 6: n=20 -> 18 (new pages start at token 8; 8 + 16 = 24); n=1 -> 1, or 0
    without ``in_page``. C=2, P=1, prefix 12: n=3 -> 3 (no 4-page boundary before 15), n=5 -> 4.
    """
    if n >= remaining:
        return remaining
    P = page_size
    first = -(-prefix_len // P) * P  # first token of the first new page
    for step in (2 * cp_size * P, P):
        end = first + (prefix_len + n - first) // step * step
        if end > prefix_len:
            return end - prefix_len
    return n if in_page else 0


class Fit(NamedTuple):
    """What ``StepBuilder.add`` gave a request.

    Attributes:
        tokens: the chunk scheduled this step, tokens (0: none; the request waits).
        cut: why the wanted chunk was cut or refused: ``"lane"`` (a lane lacks free + evictable pages),
            ``"logits_budget"`` (C-BUDGET), ``"tokens"`` (the step's token budget is spent), or None.
        lane: the short lane when ``cut == "lane"``, else -1.
    """

    tokens: int
    cut: str | None = None
    lane: int = -1


class StepBuilder:
    """Builds one prefill step's batch against the real allocator and prefix cache (see module docstring).

    Use: ``reset()``; ``add(key, prefix_len, remaining, last_loc)`` (or ``add_many``) per request, oldest
    first; ``commit()``. Keys are the caller's request objects, handed back by ``commit`` in batch order.

    Args:
        config: the ``SimConfig`` (cp_size, page_size, chunk_size, max_batch_tokens, logits budget).
        alloc: the group's allocator (a ``PageAllocator``: ``OwnerLaneAllocator`` or a storage design's).
            cache: its ``PrefixCache``.
        whole: every chunk is the wanted one or none (decode and speculative-decode steps).
    """

    def __init__(self, config: SimConfig, alloc: PageAllocator, cache: PrefixCache, *, whole: bool = False):
        self.config, self.alloc, self.cache, self.whole = config, alloc, cache, whole
        self.limit = config.logits_budget_elements  # elements per rank, or None
        self.keys: list = []  # the batch's requests, in batch order
        self.tokens_left = 0
        self._L0: list[int] = []  # the batch's prefix_lens, extend_lens and last_locs
        self._E: list[int] = []
        self._last: list[int] = []
        self._room = np.zeros(config.cp_size, dtype=_I64)  # [C] free + evictable pages
        self._room_min = 0
        self._pages = 0
        self._seen: dict = {}  # verdicts for the current batch and room
        self._plans: dict = {}  # plans made for whole batches (their (L0, E, last_loc) triples) and this room

    # ------------------------------------------------------------------------------------------ build
    def reset(self) -> None:
        """Start an empty batch with the whole token budget; read every lane's room."""
        self.keys, self._L0, self._E, self._last = [], [], [], []
        self._pages = 0  # new pages of the batch so far
        self.tokens_left = self.config.max_batch_tokens
        self.refresh_room()

    @property
    def room(self) -> np.ndarray:
        """Free + evictable pages per lane, int64 ``[C]``, as of the last ``reset`` / ``refresh_room`` (read-only)."""
        return self._room

    def refresh_room(self) -> None:
        """Re-read free + evictable pages per lane (after a lock or an eviction outside the builder)."""
        self._room = self.alloc.free_pages_per_lane() + self.cache.evictable_pages_per_lane()
        self._room_min = int(self._room.min())
        self._seen.clear()
        self._plans.clear()

    def add(self, key, prefix_len: int, remaining: int, last_loc: int) -> Fit:
        """Give request ``key`` (``prefix_len`` tokens cached, ``remaining`` to prefill, ``last_loc`` as for
        ``alloc_extend``) the longest chunk that fits after the requests added before it; ``Fit``.

        Only a step's first request may stop inside a page (``align_chunk``'s ``in_page``), so every request
        can always advance by one token while later ones never leave a head page behind.
        """
        cfg, in_page = self.config, not self.keys
        want = min(remaining, cfg.chunk_size, self.tokens_left)
        shortest = 1 if in_page else min(remaining, cfg.page_size - prefix_len % cfg.page_size)  # raw tokens
        if self.whole:
            shortest = want
        if want < shortest:
            return Fit(0, "tokens")

        def chunk(n: int) -> int:  # the aligned chunk for raw length n (0: none)
            return align_chunk(prefix_len, n, remaining, cfg.cp_size, cfg.page_size, in_page=in_page)

        def size(n: int) -> tuple[str, int] | None:  # None when chunk(n) fits, else (cut, lane)
            return self._check(prefix_len, chunk(n), last_loc) if chunk(n) else ("tokens", -1)

        first = size(want)
        if first is None:
            self._accept(key, prefix_len, chunk(want), last_loc)
            return Fit(self._E[-1])
        lo, hi = (
            shortest - 1,
            want - 1 if size(shortest) is None else 0,
        )  # longest raw n that fits; < shortest: none
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if size(mid) is None:
                lo = mid
            else:
                hi = mid - 1
        if lo < shortest and first[0] == "lane" and self.make_free_page():
            lo = shortest if size(shortest) is None else 0  # balanced sees the page made free
        if self.whole and lo < shortest and first[0] == "lane" and self.alloc.replans_after_eviction:
            # all K slots or none, on lanes chosen from free pages: evictable pages count as room but not
            # for the phase choice, so free them until a phase fits
            while size(shortest) is not None and self.make_free_page(anywhere=True):
                pass
            lo = shortest if size(shortest) is None else 0
        if lo >= shortest:
            self._accept(key, prefix_len, chunk(lo), last_loc)
        return Fit(self._E[-1] if lo >= shortest else 0, *first)

    def add_many(self, items: Sequence[tuple]) -> list[Fit]:
        """``add`` for each ``(key, prefix_len, remaining, last_loc)`` in order, with the same result, in one
        plan when every wanted chunk fits. Otherwise the longest run of requests whose wanted chunks fit is
        found by a galloping search over its length (fits are monotone in it: a batch's plan is its
        prefix's plan plus the new requests) and the request after it goes through ``add``."""
        fits: list[Fit] = []
        while len(fits) < len(items):
            rest = items[len(fits) :]
            wants = self._wanted(rest)
            k = self._longest_fitting_run(rest, wants, try_all=not fits)
            for (key, prefix_len, _, last_loc), n in zip(rest[:k], wants[:k], strict=True):
                self._accept(key, prefix_len, n, last_loc)
                fits.append(Fit(n))
            if len(fits) < len(items):
                fits.append(self.add(*items[len(fits)]))
        return fits

    def batch_plan(self) -> BatchPlan:
        """The plan of the batch so far, the one ``commit`` allocates unless pages change before (the plan the
        checks judged, kept; else made now by ``alloc.plan_extend``). The batch must not be empty."""
        key = tuple(zip(self._L0, self._E, self._last, strict=True))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.alloc.plan_extend(self._L0, self._E, self._last)
        return plan

    def placed_pages(self) -> np.ndarray:
        """New pages the batch so far takes per lane under the plan ``commit`` will allocate, int64 ``[C]``."""
        return (
            self.batch_plan().new_pages_per_lane if self.keys else np.zeros(self.config.cp_size, dtype=_I64)
        )

    def chunks(self) -> dict:
        """The batch so far: ``{key: chunk tokens}``, in batch order."""
        return dict(zip(self.keys, self._E, strict=True))

    def drop_last(self) -> None:
        """Take the last request ``add`` accepted out of the batch again (its tokens back to the budget)."""
        self.keys.pop()
        L0, n = self._L0.pop(), self._E.pop()
        self._last.pop()
        self._pages -= pages_to_finish(L0 + n, L0, self.config.page_size)
        self.tokens_left += n
        self._seen.clear()

    # ----------------------------------------------------------------------------------------- commit
    def commit(self) -> tuple[list, ExtendAllocation, np.ndarray] | None:
        """Evict what each lane lacks and allocate the plan the batch was judged on (``alloc.allocate``):
        ``(keys, allocation, logits)`` with the per-rank MQA-logits estimate (int64 ``[C]``), or None for an
        empty batch.

        Evicting can move ``balanced`` phases (they follow free pages), so the plan is checked again after
        each eviction; a batch that no longer fits loses its last request (it waits), except its only one
        under ``balanced``: a page sizing made free may have gone to an admission's host load-back since, so
        the phases moved onto a lane without room; it frees evictable pages instead (``make_free_page``, at
        most its new pages, while the room holds them in total), so the oldest request always advances.
        Each round evicts at least one page or drops one request, so this ends.
        """
        spare = None  # pages make_free_page may still free for this batch
        while self.keys:
            free = self.alloc.free_pages_per_lane()
            plan = self.batch_plan()
            need = plan.new_pages_per_lane[: free.shape[0]]  # the allocator's lanes (one pool: lane 0)
            logits = mqa_logits_elements(plan) if self.limit is not None else None  # the batch's: at return
            room = free + self.cache.evictable_pages_per_lane()
            over_budget = logits is not None and self.limit is not None and int(logits.max()) > self.limit
            if (need > room).any() or over_budget:
                spare = int(need.sum()) if spare is None else spare
                if (
                    not over_budget
                    and len(self.keys) == 1
                    and spare > 0
                    and int(need.sum()) <= int(room.sum())
                    and self.alloc.replans_after_eviction
                    and self.make_free_page(anywhere=True)
                ):
                    spare -= 1
                    continue
                for items in (self.keys, self._L0, self._E, self._last):
                    items.pop()
                continue
            short = need - free
            if (short > 0).any():
                self.cache.evict_lanes(np.maximum(short, 0))
                self._keep_current_plans()  # made under other free pages: kept only while still current
                # Eviction moves pages from evictable to free, so the room stays; a plan that follows positions
                # only (rotation, legacy) stays too: the next round would allocate at once if no lane is short.
                if self.alloc.replans_after_eviction or (need > self.alloc.free_pages_per_lane()).any():
                    continue
            a = self.alloc.allocate(
                plan, self._last
            )  # the plan judged (re-made above after a balanced eviction)
            return list(self.keys), a, logits if logits is not None else mqa_logits_elements(plan)
        return None

    def _keep_current_plans(self) -> None:
        """After an eviction: drop the plans made under other free pages but the batch's own while
        ``allocate`` would still commit it (``plan_current``: the plan ``plan_extend`` would make now is the
        same), so an eviction that moves no phase costs no new plan."""
        key = tuple(zip(self._L0, self._E, self._last, strict=True))
        plan = self._plans.get(key)
        self._plans.clear()
        if plan is not None and self.alloc.plan_current(plan, np.array(self._last, dtype=_I64)):
            self._plans[key] = plan

    def make_free_page(self, *, anywhere: bool = False) -> bool:
        """When no lane has a free page (or, ``anywhere``, whatever the free pages) but some lane has
        evictable ones, evict one page of the lane with the most, so a phase that follows free pages
        (``balanced``) can pick it; True if a page was freed."""
        if (self.alloc.total_free_pages and not anywhere) or not self.cache.evictable_pages_per_lane().any():
            return False
        lane = int(np.argmax(self.cache.evictable_pages_per_lane()))
        freed = self.cache.evict(lane, 1)
        self.refresh_room()
        return freed > 0

    # ---------------------------------------------------------------------------------------- private
    def _wanted(self, items: Sequence[tuple]) -> list[int]:
        """Aligned wanted chunks of ``items`` taken in order from the token budget left; stops at the first
        request the budget cannot serve (it goes through ``add``)."""
        cfg, left = self.config, self.tokens_left
        out: list[int] = []
        for _, prefix_len, remaining, _ in items:
            want = min(remaining, cfg.chunk_size, left)
            in_page = not (out or self.keys)
            chunk = (
                align_chunk(prefix_len, want, remaining, cfg.cp_size, cfg.page_size, in_page=in_page)
                if want > 0
                else 0
            )
            if not chunk:
                break
            out.append(chunk)
            left -= chunk
        return out

    def _longest_fitting_run(self, items: Sequence[tuple], wants: list[int], try_all: bool) -> int:
        """The largest k such that the first k ``items`` fit at their ``wants`` (all of them first when
        ``try_all``, then 1, 2, 4, ... and a binary search in the last gap)."""

        def ok(k: int) -> bool:
            return self._check_many(items[:k], wants[:k]) is None

        if try_all and wants and ok(len(wants)):
            return len(wants)
        lo, step = 0, 1
        while step <= len(wants) and ok(step):
            lo, step = step, 2 * step
        hi = min(step, len(wants) + 1) - 1  # ok(lo); hi + 1 fails or is past the end
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
        return lo

    def _check_many(self, items: Sequence[tuple], chunks: Sequence[int]) -> tuple[str, int] | None:
        """Verdict for the batch plus ``items`` at ``chunks``, memoised until the batch or room changes."""
        key = tuple(
            (prefix_len, n, last_loc) for (_, prefix_len, _, last_loc), n in zip(items, chunks, strict=True)
        )
        if key not in self._seen:
            P = self.config.page_size
            pages = self._pages + sum(pages_to_finish(L0 + n, L0, P) for L0, n, _ in key)
            if (
                self.limit is None and pages <= self._room_min
            ):  # every lane could take every new page: no plan needed
                self._seen[key] = None
            else:
                L0, E, last = (list(x) for x in zip(*key, strict=True))
                args = (self._L0 + L0, self._E + E, self._last + last)
                plan = self._plans[tuple(zip(*args, strict=True))] = self.alloc.plan_extend(*args)
                self._seen[key] = self._verdict(plan)
        return self._seen[key]

    def _check(self, prefix_len: int, n: int, last_loc: int) -> tuple[str, int] | None:
        return self._check_many([(None, prefix_len, 0, last_loc)], [n])

    def _verdict(self, plan: BatchPlan) -> tuple[str, int] | None:
        """None when ``plan`` fits every lane's room and the logits budget, else ``(cut, lane)``."""
        short = plan.new_pages_per_lane - self._room
        if (short > 0).any():
            return "lane", int(np.argmax(short))
        if self.limit is not None and int(mqa_logits_elements(plan).max()) > self.limit:
            return "logits_budget", -1
        return None

    def _accept(self, key, prefix_len: int, n: int, last_loc: int) -> None:
        self.keys.append(key)
        self._L0.append(prefix_len)
        self._E.append(n)
        self._last.append(last_loc)
        self._pages += pages_to_finish(prefix_len + n, prefix_len, self.config.page_size)
        self.tokens_left -= n
        self._seen.clear()
