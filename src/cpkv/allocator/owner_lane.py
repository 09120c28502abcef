"""Owner-lane paged allocator: per-lane free pages, atomic alloc_extend / alloc_decode (SPEC section 7).

Implements C-ALLOC, C-ATOMIC, C-FAIL-FAST, the ``balanced`` policy of C-BALANCED, speculative draft
pages and their rollback (C-DRAFT) and the pool kinds (C-POOL). Pure CPU state (numpy); only
``out_cache_loc`` is a torch tensor, on the allocator's device. A CPU allocator imports torch only when
someone reads an ``out_cache_loc`` (``ExtendAllocation``): the simulator never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..config import INTERLEAVE, CPConfig
from ..errors import AllocatorError, ConfigError
from ..kernels.backend import interpreter_requested, kernel_mode, use_kernels
from ..layout import check_pool_kind
from ..plan import BatchPlan
from ..planner import plan_arrays
from ..policy import balanced_phases, cyclic_lane_pages, follows_free_pages
from ..slots import extend_slots
from ..validate import as_int, as_int_array, lengths, per_lane_ints
from .aligned import pick_aligned
from .checks import (
    check_pool_size,
    check_shared_heads,
    draft_lengths,
    head_owners,
    lane_array,
    page_id_array,
)
from .one_page import OnePage, OnePageTables, pick_one_page
from .pool import LanePool
from .result import ExtendAllocation
from .stamp import Commits

if TYPE_CHECKING:
    import torch

_I64 = np.int64


class OwnerLaneAllocator:
    """Per-lane free pages of one CP group's paged KV pool (SPEC C-ALLOC, C-ATOMIC, C-FAIL-FAST).

    Page p lives on lane ``p % C``; lane r holds pages ``r, r + C, ..., r + (Q_r - 1) * C``. Page 0 is
    reserved for padding writes and never handed out. A fresh allocator hands out the lowest ids of each
    lane first; the same call sequence always yields the same pages (every rank replays it).

    A ``replicated`` pool (C-POOL; ``kind="replicated"``) has no owners: every rank holds all its pages, so
    the allocator is the C = 1 allocator of the same page size and policy (``self.config`` is that
    ``CPConfig(1, P, policy)``): one lane holds pages ``1 .. Q-1``, every phase is 0, every plan puts all
    tokens on lane 0, and slots are the pool's own rows (``SharedKVLayout(..., kind="replicated")``).

    Args:
        config: ``CPConfig`` (cp_size, page_size, owner_policy; ``balanced`` picks phases here).
        pages_per_lane: pages per lane (one int Q >= 1), or a sequence of C ints when ranks have unequal
            free memory; global page ids run over ``0 .. C * max(Q_r) - 1``. Replicated: the pool's pages
            (one int), held by every rank.
        device: torch device of ``out_cache_loc`` (default ``"cpu"``).
        kind: ``"sharded"`` (default, owner lanes) or ``"replicated"`` (C-POOL).

    Raises:
        ConfigError: ``config`` not a ``CPConfig``; a capacity that is not an integer >= 1, or a list whose
            length is not ``cp_size`` (replicated: a list at all); a ``device`` torch cannot allocate on; a bad
            ``CPKV_KERNELS``; an unknown ``kind``; a pool whose page tables (at most 32 B per page while built)
            would exceed ``cpkv.limits.MAX_ARRAY_BYTES``.
        KernelVersionError: a CUDA ``device`` without a usable Triton (``CPKV_KERNELS=off`` avoids it).
    """

    def __init__(
        self,
        config: CPConfig,
        pages_per_lane: int | Sequence[int],
        device: str | torch.device = "cpu",
        *,
        kind: str = "sharded",
    ) -> None:
        if not isinstance(config, CPConfig):
            raise ConfigError(f"config must be a CPConfig, got {type(config).__name__}")
        self.kind = check_pool_kind(kind)
        if kind == "replicated":
            if not hasattr(pages_per_lane, "__index__"):
                raise ConfigError(
                    f"a replicated pool has one page count, held by every rank; got pages_per_lane={pages_per_lane!r}"
                )
            cfg = config  # no owners: one lane (C-POOL)
            config = CPConfig(1, cfg.page_size, cfg.owner_policy, cfg.cp_strategy)
        C = config.cp_size
        caps = per_lane_ints("pages_per_lane", pages_per_lane, C, 1)
        check_pool_size(C, max(caps), config.page_size)
        self.config = config
        mode = kernel_mode()  # a bad CPKV_KERNELS fails here, whatever the device
        if isinstance(device, str) and device == "cpu" and not (mode == "auto" and interpreter_requested()):
            self._device = None  # the host: numpy slots, torch imported only when out_cache_loc is read
            self._kernels = False
        else:
            import torch

            try:
                dev = torch.device(device)
                torch.empty(0, dtype=torch.int64, device=dev)
            except (RuntimeError, AssertionError, TypeError) as e:
                raise ConfigError(f"device={device!r} is not usable for out_cache_loc: {e}") from None
            self._kernels = use_kernels(dev)  # out_cache_loc by a Triton kernel (C-KERNEL), read once
            self._device = None if dev.type == "cpu" and not self._kernels else dev
        self.pool = LanePool(caps)  # the free pages; its change count tells a kept plan to re-check last_locs
        self.lane_pages = self.pool.lane_pages  # [C] Q_r, page 0 included
        self.pages_per_lane = self.pool.pages_per_lane  # Q of the shared layout
        self.num_pages = self.pool.num_pages
        self.capacity_per_lane = self.pool.capacity_per_lane  # [C] usable pages
        self._one_page = OnePageTables(config.page_size, self.num_pages)
        self._commits = Commits(config, self.pool)  # the stamps of the plans it makes, the plans it committed

    # ----------------------------------------------------------------------------------------- queries
    @property
    def device(self) -> torch.device:
        """The torch device of ``out_cache_loc`` (``torch.device``; importing torch when first read)."""
        if self._device is not None:
            return self._device
        import torch

        return torch.device("cpu")

    def _on_device(self, slots: np.ndarray) -> np.ndarray | torch.Tensor:
        """``slots`` (int64 numpy) as ``out_cache_loc`` on this allocator's device: the array itself on
        the host (``ExtendAllocation`` wraps it as a tensor on first read), else a torch copy there."""
        if self._device is None:
            return slots
        import torch

        return torch.from_numpy(slots).to(self._device)

    def free_pages_per_lane(self) -> np.ndarray:
        """Free pages of each lane, int64 ``[C]`` (a copy)."""
        free: np.ndarray = self.pool.free.copy()
        return free

    def used_pages_per_lane(self) -> np.ndarray:
        """Pages handed out and not yet freed, per lane, int64 ``[C]``."""
        used: np.ndarray = self.capacity_per_lane - self.pool.free
        return used

    @property
    def page_size(self) -> int:
        """Tokens per page (P), ``config.page_size``."""
        return self.config.page_size

    @property
    def replans_after_eviction(self) -> bool:
        """Whether a plan follows the free pages (``balanced``, C-BALANCED), so a scheduler plans again after
        freeing pages (``PageAllocator``); False under ``rotation`` and ``legacy``."""
        return follows_free_pages(self.config.owner_policy)

    @property
    def min_free_pages(self) -> int:
        """Free pages of the emptiest-by-capacity lane, ``min(free_pages_per_lane())``, in pages."""
        return int(self.pool.free.min())

    @property
    def total_free_pages(self) -> int:
        """Free pages over all lanes, in pages."""
        return int(self.pool.free.sum())

    def is_free(self, pages: object) -> np.ndarray:
        """Bool ``[n]``: whether each page id is currently free (ids must be in ``[0, num_pages)``)."""
        return self.pool.is_free(page_id_array(pages, self.num_pages))

    def state_digest(self) -> str:
        """SHA-256 hex of the full free-list state; equal on every rank that replayed the same calls."""
        return self.pool.digest()

    # ------------------------------------------------------------------------------------- allocation
    def alloc_pages(self, owners: object) -> np.ndarray:
        """One page of each requested lane, in order (SPEC C-ALLOC), atomically (C-ATOMIC).

        Args:
            owners: ``[n]`` lanes in ``[0, C)`` (ints; list, numpy or CPU tensor).

        Returns:
            ``[n]`` int64 page ids, ``page % C == owners``.

        Raises:
            AllocatorError: an owner out of range. LaneExhausted: a lane has fewer free pages than the
                call needs; nothing is allocated.
        """
        owners = lane_array(owners, self.config.cp_size)
        # Runs of equal owners: [4, 4, 1, 4] -> owners [4, 1, 4], pages [2, 1, 1].
        starts = np.flatnonzero(np.diff(owners, prepend=-1)) if owners.size else np.zeros(0, _I64)
        run_pages = np.diff(starts, append=owners.shape[0])
        pages, counts = self.pool.pick(owners[starts], run_pages)
        self.pool.commit(pages, counts)
        return pages

    def alloc_extend(self, prefix_lens: object, extend_lens: object, last_locs: object) -> ExtendAllocation:
        """Plan a batch and allocate all its new pages at once (SPEC section 7, C-ATOMIC, C-FAIL-FAST).

        Head owners come from ``lane(last_loc // P)``. Under ``balanced`` each request's phase keeps the
        tightest lane freest after the earlier requests of the batch took theirs (C-BALANCED).

        Args:
            prefix_lens: ``[B]`` tokens already cached (ints >= 0).
            extend_lens: ``[B]`` new tokens (ints >= 0).
            last_locs: ``[B]`` slot of position ``prefix_len - 1``, -1 when ``prefix_len == 0``.

        Returns:
            ``ExtendAllocation``; e.g. C=4, P=64, Q=8, fresh, ``L0=0, E=1000``: new pages
            ``[4,8,1,5,2,6,3,7,11,15,10,14,9,13,12,16]``, ``out_cache_loc`` starts ``256..319, 512..575``.

        Raises:
            PlanError: bad lengths or mismatched arrays, or a plan above ``cpkv.limits.MAX_ARRAY_BYTES``
                (checked before any array is built). AllocatorError: a ``last_loc`` inconsistent with
                its ``prefix_len`` (``(last_loc + 1) % P != prefix_len % P``), out of range, or on a free
                page; two requests extending the same partly filled page. LaneExhausted: a lane is
                short. In every case nothing is allocated.
        """
        # The page-aligned path writes slots on the host: where a kernel writes them on the device (C-KERNEL),
        # the general path keeps that one launch.
        got = (
            None
            if self._kernels
            else pick_aligned(self.pool, self.config, prefix_lens, extend_lens, last_locs)
        )
        if got is not None:
            return self._take(got)
        fast = self._alloc_one_page(prefix_lens, extend_lens, last_locs)
        return fast if fast is not None else self._alloc_planned(prefix_lens, extend_lens, last_locs)

    def _alloc_one_page(
        self, prefix_lens: object, extend_lens: object, last_locs: object
    ) -> ExtendAllocation | None:
        """``alloc_extend`` (``extend_lens`` None: ``alloc_decode``) of a batch whose requests each take at
        most one new page, without the planner (``one_page.py``); None when that path declines."""
        got = pick_one_page(self.pool, self._one_page, self.config, prefix_lens, extend_lens, last_locs)
        return None if got is None else self._take(got)

    def _take(self, got: OnePage) -> ExtendAllocation:
        """Commit what a path without the planner picked (``one_page.py``, ``aligned.py``), plan deferred."""
        slots, new_pages, counts, make_plan = got
        out_cache_loc = self._on_device(slots)
        if counts is not None:
            self.pool.commit(new_pages, counts)  # only once out_cache_loc exists on the device (C-ATOMIC)
            new_pages.setflags(write=False)
        return ExtendAllocation(out_cache_loc, None, new_pages, make_plan=make_plan)

    def _alloc_planned(self, prefix_lens: object, extend_lens: object, last_locs: object) -> ExtendAllocation:
        """The general path of ``alloc_extend``: plan the batch, then commit the plan."""
        plan, last = self._plan_extend(prefix_lens, extend_lens, last_locs)
        return self._commit_plan(plan, last)

    def plan_extend(self, prefix_lens: object, extend_lens: object, last_locs: object) -> BatchPlan:
        """The plan ``alloc_extend`` would allocate now, without taking any page (plan, then commit).

        Validates ``last_locs`` and derives head owners as ``alloc_extend`` does; under ``balanced`` the
        phases reflect the current free pages. A scheduler checks the plan (``new_pages_per_lane`` against
        each lane's room, ``mqa_logits_elements`` against a budget), may evict, then commits that same plan
        with ``allocate(plan, last_locs)``. The allocator records (``stamp.Commits``) the ``last_locs``, the
        pool's change count and (``balanced``) the free pages the plan was made under.

        Raises:
            PlanError, AllocatorError, UnsupportedPagePlan: as ``alloc_extend``; nothing changes.
        """
        return self._plan_extend(prefix_lens, extend_lens, last_locs)[0]

    def plan_current(self, plan: BatchPlan, last_locs: np.ndarray) -> bool:
        """Whether ``allocate(plan, last_locs)`` would commit ``plan`` now (``last_locs``: int64 ``[B]``, the
        ones it was planned with): this allocator's open plan, no ``last_loc`` on a page freed since, and
        (``balanced``) the phases the current free pages choose are the plan's. A scheduler that freed
        pages keeps such a plan instead of planning again (the plan ``plan_extend`` would make now is the
        same). Raises nothing; changes nothing."""
        return self._commits.current(plan, last_locs)

    def allocate(self, plan: BatchPlan, last_locs: object) -> ExtendAllocation:
        """Commit a plan of ``plan_extend``: take its new pages on their lanes, atomically (C-ATOMIC).

        The result is the one ``alloc_extend`` of the plan's lengths and ``last_locs`` would give now; the
        plan is refused when it is no longer that plan: pages changed since it was made and a ``last_loc``
        now lies on a free page, or (``balanced``, C-BALANCED) the free pages now choose other phases. A
        ``rotation`` or ``legacy`` plan does not depend on the free pages.

        Args:
            plan: a ``BatchPlan`` this allocator's ``plan_extend`` returned.
            last_locs: ``[B]`` the ``last_locs`` it was planned with.

        Returns:
            ``ExtendAllocation`` (``plan`` is this plan).

        Raises:
            StalePlanError: a plan this allocator did not make (a copy of its plan included: only the plan
                object ``plan_extend`` returned commits) or already allocated, other ``last_locs``, or
                phases the free pages no longer choose (plan again). AllocatorError: a ``last_loc`` on a page freed since.
                LaneExhausted: a lane is short. In every case nothing is allocated.
        """
        last = self._commits.check(plan, last_locs)
        return self._commit_plan(plan, last)

    def _commit_plan(self, plan: BatchPlan, last: np.ndarray) -> ExtendAllocation:
        """Pick every run's pages, write ``out_cache_loc``, then take the pages (C-ATOMIC)."""
        if plan.config.cp_strategy == INTERLEAVE:  # one page a run: lanes in closed form, no run sort
            m = plan.page_indptr[1:] - plan.page_indptr[:-1]
            lane_pages = cyclic_lane_pages(m, plan.request_phases, plan.config.cp_size)
            new_pages, counts = self.pool.pick_cyclic(plan.request_phases, m, plan.page_owners, lane_pages)
        else:
            runs = plan.token_runs
            seg = runs.pages > 0  # the runs of new pages (zigzag segments), in page order
            new_pages, counts = self.pool.pick(runs.owner[seg], runs.pages[seg])
        out: np.ndarray | torch.Tensor
        if self._kernels:  # CUDA (or Triton's interpreter): written on the device in one launch
            from ..kernels.slots import fill_out_cache_loc

            out = fill_out_cache_loc(plan, last, new_pages, device=self._device)
        else:
            out = self._on_device(extend_slots(plan, last, new_pages))
        self.pool.commit(new_pages, counts)  # only once out_cache_loc exists on the device (C-ATOMIC)
        self._commits.committed(plan)
        new_pages.setflags(write=False)
        return ExtendAllocation(out_cache_loc=out, plan=plan, new_pages=new_pages)

    def alloc_decode(self, seq_lens: object, last_locs: object) -> ExtendAllocation:
        """Append one token per request: ``alloc_extend(seq_lens, [1] * B, last_locs)`` (SPEC section 7).

        A new page is taken only when position ``seq_len`` starts a page, on the lane the policy gives
        (C-PHASE; ``balanced``: C-BALANCED), else the token goes to ``last_loc + 1``. Runs without the
        extend planner (``one_page.py``); the result's ``plan`` is built on first access.

        Args:
            seq_lens: ``[B]`` tokens cached per request (ints >= 0; list, numpy or CPU tensor).
            last_locs: ``[B]`` slot of position ``seq_len - 1``, -1 when ``seq_len == 0``.

        Returns:
            ``ExtendAllocation`` with ``out_cache_loc`` ``[B]`` int64.

        Raises:
            As ``alloc_extend``; in every case nothing is allocated.
        """
        fast = self._alloc_one_page(seq_lens, None, last_locs)
        if fast is not None:
            return fast
        L0 = as_int_array("seq_lens", seq_lens)
        return self._alloc_planned(L0, np.ones_like(L0), last_locs)

    # ------------------------------------------------------------------- speculative decoding (C-DRAFT)
    def alloc_draft(self, seq_lens: object, last_locs: object, num_draft_tokens: int) -> ExtendAllocation:
        """Slots for the k draft tokens of one speculative step: positions ``seq_len .. seq_len + k - 1``.

        Exactly ``alloc_extend(seq_lens, [k] * B, last_locs)`` (SPEC C-DRAFT): the same pages on the same
        lanes under the same policy (``balanced`` picks phases from the free pages, as for a prefill), all
        or nothing. The k verify tokens of request i are ``out_cache_loc[i*k : (i+1)*k]``; after
        verification ``release_tail`` gives back the pages past the kept tokens.

        Args:
            seq_lens: ``[B]`` tokens of each request whose KV is cached (ints >= 0).
            last_locs: ``[B]`` slot of position ``seq_len - 1``, -1 when ``seq_len == 0``.
            num_draft_tokens: k, draft tokens per request, an int >= 1.

        Returns:
            ``ExtendAllocation`` with ``out_cache_loc`` ``[B * k]`` int64.

        Raises:
            AllocatorError: ``num_draft_tokens`` not an int in ``[1, 2**63 - 1]``. Otherwise as ``alloc_extend``
                (a PlanError for ``seq_len + k`` above ``MAX_POSITION``); in every case
                nothing is allocated.
        """
        L0, E = draft_lengths(seq_lens, num_draft_tokens)
        return self.alloc_extend(L0, E, last_locs)

    def release_tail(self, page_ids: object, new_len: int) -> np.ndarray:
        """Roll one request back to ``new_len`` tokens: free its pages that hold no kept position (C-DRAFT).

        ``page_ids`` are the request's pages in position order, so page i holds positions
        ``i*P .. i*P + P-1`` and its first position is ``i*P``. The pages with ``i*P >= new_len``, i.e.
        ``page_ids[ceil(new_len / P):]``, go back to their own lanes; a page that still holds a kept token
        stays (its rejected rows are overwritten by the next step). Example P=4, pages ``[9, 6, 3]``
        (12 positions), ``new_len=5``: page 6 keeps position 4, so only page 3 is freed -> ``[3]``.

        Args:
            page_ids: ``[m]`` the request's page ids in position order (ints; list, numpy or CPU tensor).
            new_len: tokens the request keeps, ``0 <= new_len <= m * P``.

        Returns:
            ``[n]`` int64 page ids freed, in position order (empty when every page holds a kept token).

        Raises:
            AllocatorError: ``new_len`` not an int, negative or beyond the pages (``> m * P``); a page id out
                of range, page 0, a page that is free or beyond its lane's capacity, or one listed twice
                (anywhere in ``page_ids``). Nothing is freed.
        """
        pages = page_id_array(page_ids, self.num_pages)
        P, m = self.config.page_size, pages.shape[0]
        new_len = as_int("new_len", new_len, AllocatorError)
        if not 0 <= new_len <= m * P:
            raise AllocatorError(
                f"new_len={new_len} out of range [0, {m * P}]: the request's {m} pages of {P} tokens hold "
                f"positions 0 .. {m * P - 1}"
            )
        self.pool.check_held(pages, "release_tail: the request's pages include")
        tail: np.ndarray = pages[-(-new_len // P) :].copy()
        self.pool.release(tail)  # checked above with the rest of the request's pages
        return tail

    def free(self, pages: object) -> None:
        """Return pages to their lanes (SPEC C-ALLOC); all-or-nothing.

        Args:
            pages: ``[n]`` page ids (ints; list, numpy or CPU tensor).

        Raises:
            AllocatorError: page 0, an id out of range or beyond its lane's capacity, a page already
                free, or a page listed twice; nothing is freed.
        """
        pages = page_id_array(pages, self.num_pages)
        if pages.size == 0:
            return
        self.pool.check_held(pages)
        self.pool.release(pages)

    # ---------------------------------------------------------------------------------------- private
    def _plan_extend(
        self, prefix_lens: object, extend_lens: object, last_locs: object
    ) -> tuple[BatchPlan, np.ndarray]:
        """``(plan, last_locs)`` of a batch, the plan recorded with the state it was made under."""
        L0, E = lengths(prefix_lens, extend_lens)
        last = as_int_array("last_locs", last_locs, L0.shape[0])
        head = head_owners(self.pool, self.config, L0, last)
        check_shared_heads(L0, E, last, self.config.page_size)
        P, C = self.config.page_size, self.config.cp_size
        balanced = follows_free_pages(self.config.owner_policy)
        phases = balanced_phases(L0, E, self.pool.free, P, C, self.config.cp_strategy) if balanced else None
        plan = plan_arrays(L0, E, self.config, head_owners=head, phases=phases, lanes_valid=True)
        self._commits.stamp(plan, last, balanced)
        return plan, last
