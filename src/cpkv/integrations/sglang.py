"""SGLang 0.5.23 adapter: an owner-lane paged allocator SGLang constructs in place of its own (docs/sglang.md).

``OwnerLaneTokenToKVPoolAllocator`` subclasses SGLang's ``PagedTokenToKVPoolAllocator`` and serves every
call SGLang's scheduler and ``RadixCache`` make on it from cpkv's ``OwnerLaneAllocator`` (C-ALLOC,
C-ATOMIC, C-OWNER-EQ-COMPUTE). This module is the only one in cpkv that imports sglang.

Page ids: ``size`` is what SGLang passes, one rank's KV pool in tokens, so one rank holds
``n = size // page_size`` pages plus its padding page (SGLang sizes every rank's KV buffer
``size + page_size`` slots). Lane r is rank r's buffer: ``Q = n + 1`` pages, global page ``p`` on lane
``p % C`` at local page ``p // C``. Every rank's local page 0 (global pages ``0 .. C-1``) is its padding
page and never handed out, as in SGLang's own sharded allocator; pages ``C .. C*Q - 1`` are, ``C * n`` in
all. At ``cp_size=1`` these are SGLang's own ids (``1 .. n``).
"""

from __future__ import annotations

import numpy as np
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from ..allocator import ExtendAllocation, OwnerLaneAllocator
from ..config import CPConfig, check_int
from ..errors import AllocatorError, LaneExhausted
from ..layout import SharedKVLayout
from ..planner import BatchPlan
from ..validate import as_int_array

_I64 = np.int64
_TORCH_I64 = torch.int64


def _host(name: str, values) -> np.ndarray:
    """``values`` (a tensor on any device: one device-to-host copy; or a sequence) as int64 numpy ``[n]``,
    read flat (SGLang hands over ``[B]`` and ``[B, 1]`` tensors); AllocatorError naming ``name`` otherwise.

    SGLang's own case, an int64 CPU tensor without grad, is read in place (the tensor's memory, not a copy:
    callers never write it); anything else goes through ``as_int_array``'s checks."""
    if (
        type(values) is torch.Tensor
        and values.dtype is _TORCH_I64
        and values.is_cpu
        and not values.requires_grad
    ):
        arr = values.numpy()
        return arr if arr.ndim == 1 else arr.reshape(-1)
    return as_int_array(name, values, error=AllocatorError, flatten=True)


def _pages_of(slots: np.ndarray, page_size: int) -> np.ndarray:
    """The distinct pages of ``slots`` (int64 ``[n]``), ascending: ``np.unique(slots // page_size)``, with
    runs of one page dropped to one entry first (a request's slots run page by page, so the sort that
    follows sees about one entry a page). Example P=4: ``[9, 10, 11, 4, 5]`` -> ``[1, 2]``."""
    pages = slots // page_size
    if pages.shape[0] > 1:
        first = np.empty(pages.shape[0], dtype=bool)  # [n] whether each entry starts a run of one page
        first[0] = True
        np.not_equal(pages[1:], pages[:-1], out=first[1:])
        pages = pages[first]
    return np.unique(pages)


class OwnerLaneTokenToKVPoolAllocator(PagedTokenToKVPoolAllocator):
    """SGLang's paged allocator contract over owner lanes (SPEC C-ALLOC, C-ATOMIC, C-OWNER-EQ-COMPUTE).

    Args:
        size: one rank's KV pool in tokens, as SGLang passes it (``max_total_num_tokens``); the pool of
            the group is ``cp_size`` lanes of ``size // page_size + 1`` pages (module docstring).
        page_size: tokens per page (P >= 1). dtype: kept for SGLang.
        device: torch device of every returned tensor (``out_cache_loc`` is int64 there).
        kvcache: kept for SGLang (``get_kvcache``, host copies); when not None it also gets
            ``kvcache.owner_lane_allocator = self``, so the CP prefill's split hook
            (``sglang_cp_split``) finds ``last_plan`` from the forward's KV pool.
        need_sort: SGLang's disaggregation flag: freed pages wait, staged, until an allocation runs short,
            then return to their lanes lowest id first (``merge_and_sort_free``).
        cp_size: ranks in the CP group (C >= 1); default ``default_cp_size`` (1, or as ``for_group`` set).
        owner_policy: cpkv owner policy (``CPConfig``); default ``default_owner_policy``.

    Attributes:
        config: the group's ``CPConfig``. lanes: the ``OwnerLaneAllocator`` behind every call (``Q`` pages a lane).
        layout: ``SharedKVLayout(C, P, Q)``; ``layout.write_slots(out_cache_loc)`` indexes a rank's own buffer.
        last_plan: ``BatchPlan`` of the latest successful ``alloc_extend`` / ``alloc_decode`` / ``alloc``
            (None before the first and after ``clear``; built on first read, so a decode step whose plan
            nobody reads keeps cpkv's single-page fast path): ``token_owner`` [sum E], ``gather_index`` [sum E], ``request_phases``
            [B] for the model runner (docs/sglang.md). A call that returns None leaves it as it was.
        num_pages: pages that can be handed out, ``C * n``; ``size`` is ``C * size``, the group's tokens (both as SGLang's
            sharded allocator widens them).

    Raises:
        ConfigError: a bad ``cp_size``, ``page_size``, ``size < page_size`` or unknown ``owner_policy``.
    """

    default_cp_size: int = 1
    default_owner_policy: str | None = None

    def __init__(
        self, size, page_size, dtype, device, kvcache, need_sort, *, cp_size=None, owner_policy=None
    ) -> None:
        cp_size = self.default_cp_size if cp_size is None else cp_size
        owner_policy = self.default_owner_policy if owner_policy is None else owner_policy
        self.config = CPConfig(cp_size, page_size, owner_policy)  # validates before SGLang's clear() runs
        check_int("size", size, self.config.page_size)
        self._last: ExtendAllocation | None = None  # set by clear(), which SGLang's __init__ calls
        super().__init__(size * self.config.cp_size, page_size, dtype, device, kvcache, need_sort)
        if kvcache is not None:  # the forward's way from its KV pool back to last_plan (sglang_cp_split)
            kvcache.owner_lane_allocator = self

    @classmethod
    def for_group(cls, cp_size: int, owner_policy: str | None = None) -> type:
        """A subclass whose ``cp_size`` / ``owner_policy`` defaults are these: SGLang's platform hook
        ``get_paged_allocator_cls()`` returns a class that SGLang constructs with the six base arguments.

        Raises: ConfigError for a bad ``cp_size`` or policy (checked now, not at SGLang's construction).
        """
        CPConfig(cp_size, 1, owner_policy)
        attrs = {
            "default_cp_size": int(cp_size),
            "default_owner_policy": owner_policy,
            "__module__": cls.__module__,
        }
        return type(f"{cls.__name__}CP{int(cp_size)}", (cls,), attrs)

    @property
    def last_plan(self) -> BatchPlan | None:
        """The ``BatchPlan`` of the latest successful allocation, or None (see the class doc)."""
        return None if self._last is None else self._last.plan

    @property
    def cp_size(self) -> int:
        """Ranks in the CP group (C)."""
        return self.config.cp_size

    # ------------------------------------------------------------------------------------- capacity
    def clear(self) -> None:
        """Every page free again (fresh lanes, no staged page, no open free group)."""
        C, P = self.config.cp_size, self.config.page_size
        lane_pages = self.size // C // P + 1  # Q: one rank's pages plus its padding page
        self.lanes = OwnerLaneAllocator(self.config, lane_pages, device=self.device)
        self.lanes.alloc_pages(np.arange(1, C))  # local page 0 of lanes 1..C-1: padding, held for good
        self.layout = SharedKVLayout(C, P, lane_pages)
        self.num_pages = C * (lane_pages - 1)
        self._last = None
        self.free_pages = self.release_pages = None  # SGLang's flat lists: unused here, fail loud if read
        self.free_group: list[torch.Tensor] | None = None  # an open free group's freed slots
        self.free_page_ids_group: list[torch.Tensor] = []  # and its page ids freed by id
        self._staged: list[np.ndarray] = []  # need_sort: freed page ids not yet back on their lanes
        self._staged_mask = np.zeros(self.lanes.num_pages, dtype=bool)
        self._staged_per_lane = np.zeros(C, dtype=_I64)  # [C] staged pages of each lane

    def resize(self, config) -> None:
        """SGLang's post-capture resize: ``config.max_total_num_tokens`` is one rank's new pool; clears."""
        self.size = (
            check_int("max_total_num_tokens", config.max_total_num_tokens, self.page_size) * self.cp_size
        )
        self.clear()

    def available_size(self) -> int:
        """Admission floor in tokens: ``cp_size * page_size * min over lanes of (free + staged pages)``."""
        free = self.lanes.free_pages_per_lane() + self._staged_per_lane
        return self.cp_size * self.page_size * int(free.min())

    def aggregate_free_size(self) -> int:
        """Free tokens over all lanes, ``page_size * (free + staged pages)``: the conservation term of
        SGLang's invariant checker (not an admission gate; see ``available_size``)."""
        return self.page_size * (self.lanes.total_free_pages + int(self._staged_per_lane.sum()))

    def get_all_free_pages(self) -> torch.Tensor:
        """Every free page id (on a lane or staged), ascending, int64 ``[n]`` on ``device``."""
        ids = np.arange(self.lanes.num_pages, dtype=_I64)
        free = np.flatnonzero(self.lanes.is_free(ids) | self._staged_mask)
        return torch.from_numpy(free).to(self.device)

    def merge_and_sort_free(self) -> None:
        """Return staged pages (need_sort) to their lanes so that the lowest id comes off first."""
        if self._staged:
            pages = np.sort(np.concatenate(self._staged))
            self._staged, self._staged_mask[:], self._staged_per_lane[:] = [], False, 0
            self.lanes.free(pages)

    def get_extend_allocation_demand(
        self, prefix_lens_cpu, seq_lens_cpu, *, conservative_num_tokens, shard_size
    ):
        """Tokens SGLang's scheduler must see in ``available_size()`` before ``alloc_extend`` (evicting first).

        A request with m new pages puts at most ``ceil(m / C)`` on any lane whatever its phase (C-ZIGZAG),
        so ``C * P * sum(ceil(m_i / C))`` of floor guarantees the batch fits; never below SGLang's own
        ``conservative_num_tokens``. Equals it at ``cp_size=1``.
        """
        P, C = self.page_size, self.cp_size
        L0, seq = _host("prefix_lens_cpu", prefix_lens_cpu), _host("seq_lens_cpu", seq_lens_cpu)
        m = -(-seq // P) - -(-L0 // P)  # [B] new pages
        return max(int(conservative_num_tokens), C * P * int((-(-m // C)).sum()))

    def evict_to_free_tokens(self, tree_cache, num_tokens: int) -> bool | None:
        """Evict unlocked prefix-cache pages until ``available_size() >= num_tokens`` or nothing is left.

        One eviction of k tokens raises the lane floor by less than k, so this repeats (deterministic:
        every rank evicts the same pages). Returns whether the floor was reached; None without a cache.
        """
        if tree_cache is None or not tree_cache.supports_prefix_sharing():
            return None
        while (short := num_tokens - self.available_size()) > 0:
            if tree_cache.evict(EvictParams(num_tokens=max(short, self.page_size))).num_tokens_evicted == 0:
                return False
        return True

    # ----------------------------------------------------------------------------------- allocation
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size // P`` whole pages as a new chain (prefix 0, C-ZIGZAG owners): int64 ``[pages * P]``
        slots, each page's ``p*P .. p*P+P-1`` in order; None when a lane is short (nothing taken)."""
        pages = check_int("need_size", need_size, 0) // self.page_size
        return self._serve(lambda: self.lanes.alloc_extend([0], [pages * self.page_size], [-1]))

    def alloc_extend(
        self,
        prefix_lens,
        prefix_lens_cpu,
        seq_lens,
        seq_lens_cpu,
        last_loc,
        extend_num_tokens,
        num_new_pages=None,
    ):
        """Slots for the extend tokens of a batch (SPEC section 7), or None when a lane is short (C-ATOMIC).

        Args:
            prefix_lens, seq_lens: ``[B]`` device tensors (unused: the ``_cpu`` copies are read).
            prefix_lens_cpu, seq_lens_cpu: ``[B]`` int CPU tensors, tokens cached and after the extend.
            last_loc: ``[B]`` slot of position ``prefix_len - 1`` (-1 when 0); copied to the host once.
            extend_num_tokens: ``sum(seq_lens - prefix_lens)``, tokens.
            num_new_pages: SGLang's hint; ignored (cpkv counts pages per lane itself).

        Returns:
            ``out_cache_loc``, int64 ``[extend_num_tokens]`` on ``device``; the plan in ``last_plan``.

        Raises:
            AllocatorError, PlanError: ``extend_num_tokens`` not the sum, a negative extend, a ``last_loc``
                inconsistent with its prefix or not on a held page; nothing is allocated.
        """
        L0, seq = _host("prefix_lens_cpu", prefix_lens_cpu), _host("seq_lens_cpu", seq_lens_cpu)
        if L0.shape != seq.shape:
            raise AllocatorError(f"prefix_lens_cpu has {L0.shape[0]} entries but seq_lens_cpu {seq.shape[0]}")
        E = seq - L0  # [B] extend tokens
        if int(E.sum()) != extend_num_tokens:
            raise AllocatorError(
                f"extend_num_tokens={extend_num_tokens} but seq_lens_cpu - prefix_lens_cpu sums to {int(E.sum())}"
            )
        last = _host("last_loc", last_loc)
        return self._serve(lambda: self.lanes.alloc_extend(L0, E, last))

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc) -> torch.Tensor | None:
        """One slot per request at position ``seq_len - 1`` (``seq_lens_cpu`` counts it), ``last_loc`` the
        slot of ``seq_len - 2``: int64 ``[B]`` on ``device``, or None when a lane is short. Raises as
        ``alloc_extend``."""
        seq = _host("seq_lens_cpu", seq_lens_cpu)
        last = _host("last_loc", last_loc)
        return self._serve(lambda: self.lanes.alloc_decode(seq - 1, last))

    def _serve(self, call) -> torch.Tensor | None:
        """Run one cpkv allocation; on a short lane merge staged pages and retry once, then None."""
        try:
            allocation: ExtendAllocation = call()
        except LaneExhausted:
            if not self._staged:
                return None
            self.merge_and_sort_free()
            try:
                allocation = call()
            except LaneExhausted:
                return None
        self._last = allocation
        return allocation.out_cache_loc

    # ----------------------------------------------------------------------------------------- free
    def free(self, free_index: torch.Tensor) -> None:
        """Free the pages of these slots (``unique(free_index // P)``; a partial page frees the whole page).

        Inside a free group the slots are copied and freed at ``free_group_end``. Raises AllocatorError for
        page 0, a free or unknown page; nothing is freed.
        """
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(free_index.clone())
            return
        self._release(_pages_of(_host("free_index", free_index), self.page_size))

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free row positions ``start_pos ..`` of one request: pages ``free_index[::P] // P``, each once.

        Raises: AllocatorError when ``start_pos`` is not page-aligned, or as ``free``.
        """
        if free_index.numel() == 0:
            return
        if start_pos % self.page_size:
            raise AllocatorError(
                f"segment start {start_pos} is not page-aligned (page_size={self.page_size})"
            )
        self.free_page_ids(free_index[:: self.page_size] // self.page_size)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Free exactly these page ids (no duplicates), or defer them inside a free group. Raises as ``free``."""
        if page_ids.numel() == 0:
            return
        if self.free_group is not None:
            self.free_page_ids_group.append(page_ids.clone())
            return
        self._release(_host("page_ids", page_ids))

    def _release_page_ids(self, *page_ids: torch.Tensor) -> None:
        self._release(np.concatenate([_host("page_ids", p) for p in page_ids]))

    def free_group_begin(self) -> None:
        """Defer ``free`` / ``free_segment`` until ``free_group_end``. Raises AllocatorError when nested."""
        if self.free_group is not None:
            raise AllocatorError("free groups cannot be nested: free_group_end() the open group first")
        self.free_group, self.free_page_ids_group = [], []

    def free_group_end(self) -> None:
        """Free the group's pages in one all-or-nothing call: the page ids freed by id come off first, then
        the pages of the freed slots (SGLang's order). Raises AllocatorError outside a group, or as ``free``."""
        if self.free_group is None:
            raise AllocatorError("free_group_end() without free_group_begin()")
        slots, ids = self.free_group, self.free_page_ids_group
        self.free_group, self.free_page_ids_group = None, []
        by_slot = (
            _pages_of(_host("free_index", torch.cat(slots)), self.page_size) if slots else np.zeros(0, _I64)
        )
        by_id = _host("page_ids", torch.cat(ids)) if ids else np.zeros(0, _I64)
        self._release(np.concatenate([by_id, by_slot]))

    def _release(self, pages: np.ndarray) -> None:
        """Give pages back: to their lanes (the first comes off first), or staged under ``need_sort``."""
        bad = pages[(pages < self.cp_size) | (pages >= self.lanes.num_pages)]
        if bad.size:
            p = int(bad[0])
            why = (
                "a padding page"
                if 0 <= p < self.cp_size
                else f"not in [{self.cp_size}, {self.lanes.num_pages})"
            )
            raise AllocatorError(f"cannot free page {p}: {why}")
        if not self.need_sort:
            self.lanes.free(pages)
            return
        uniq, cnt = np.unique(pages, return_counts=True)
        bad = np.concatenate([pages[self.lanes.is_free(pages) | self._staged_mask[pages]], uniq[cnt > 1]])
        if bad.size:
            raise AllocatorError(
                f"cannot free page {int(bad[0])}: already free or listed twice (double free)"
            )
        self._staged.append(pages)
        self._staged_mask[pages] = True
        self._staged_per_lane += np.bincount(pages % self.cp_size, minlength=self.cp_size)
