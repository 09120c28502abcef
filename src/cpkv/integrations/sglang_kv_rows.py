"""KV rows on each rank's own buffer: SGLang 0.5.23's KV pools with cpkv's owner-lane layout (docs/sglang.md).

With cpkv's allocator, ``out_cache_loc`` holds *group* slots: page ``p`` lives on lane (rank) ``p % C`` at
local page ``p // C`` (C-LAYOUT), so a slot reaches ``C * Q * P`` while one rank's KV buffer has
``Q * P = size + page_size`` rows. SGLang's stock pools write ``kv_buffer[out_cache_loc]`` and would run past
the buffer. The pools here are SGLang's own classes with ``set_kv_buffer`` (and MLA's ``set_mla_kv_buffer``)
narrowed to this rank, exactly as SGLang's own ``PageInterleave*TokenToKVPool`` narrow theirs: of the batch's
tokens, rank ``r`` keeps those on its lane, ``layout.owned_mask(loc, r)`` (under C-OWNER-EQ-COMPUTE the
tokens it computes), and writes them at ``layout.write_slots(loc)``, rows ``< Q * P``. SGLang's CP strategy
hands ``set_kv_buffer`` the whole batch's K/V (the all-gathered rows) with the whole ``out_cache_loc`` on
every rank; a call with only the rank's own tokens and their slots writes the same rows.

Reads go through the rank-major view, the C ranks' buffers one after another (lane ``r`` at row
``r * Q * P``), at ``layout.read_slots(slot)``: ``read_kv_rows`` assembles it, as an all-gather of the lane
buffers would, and reads a batch's slots. ``write_kv_rows`` writes one batch on every rank through the pools'
own ``set_kv_buffer``: the path an engine loop without a model forward drives.

SGLang's platform hook ``get_kv_pool_cls(kind)`` (``cpkv.integrations.sglang_platform``) returns these
classes bound to the group (``for_group``); the configurator builds them with the in-tree keyword arguments,
and the rank is SGLang's attention-CP rank. Imports sglang: load it after SGLang's platform is resolved.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sglang.srt.mem_cache.memory_pool import (
    DSATokenToKVPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
    unwrap_write_loc,
)

from ..config import check_cp_size, check_lane
from ..errors import ConfigError, LayoutError
from ..layout import SharedKVLayout


def _attention_cp_rank() -> int:
    """SGLang's attention-CP rank of this process (its parallel context, published at start-up)."""
    from sglang.srt.runtime_context import get_parallel

    return int(get_parallel().attn_cp_rank)


class OwnerLaneKVPoolMixin:
    """The owner-lane write door over one of SGLang's KV pools (module docstring; SPEC C-LAYOUT,
    C-OWNER-EQ-COMPUTE).

    Keyword args (besides the pool's own):
        cp_size: ranks in the CP group (C >= 1); default ``default_cp_size`` (``for_group`` sets it).
        cp_rank: this pool's rank, ``0 <= cp_rank < C``; default SGLang's attention-CP rank.

    Attributes:
        cp_size, cp_rank: as above. layout: ``SharedKVLayout(C, page_size, Q)``, ``Q = (size + page_size)
        // page_size`` pages a lane: this rank's buffer rows are ``[0, Q * page_size)``.

    Raises:
        ConfigError: a bad ``cp_size`` or ``cp_rank``, or a buffer that is not whole pages.
    """

    default_cp_size: int = 1
    size: int  # SGLang's pool: tokens (rows but the padding page) and tokens per page
    page_size: int

    def __init__(self, *args, cp_size: int | None = None, cp_rank: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        C = check_cp_size(self.default_cp_size if cp_size is None else cp_size)
        rank = _attention_cp_rank() if cp_rank is None else cp_rank
        self.cp_size, self.cp_rank = C, check_lane("cp_rank", rank, C, ConfigError)
        rows = self.size + self.page_size  # SGLang's buffer: size + one padding page
        if rows % self.page_size:
            raise ConfigError(f"KV pool size={self.size} is not a multiple of page_size={self.page_size}")
        self.layout = SharedKVLayout(C, self.page_size, rows // self.page_size)
        # owned_rows of the latest out_cache_loc
        self._rows_loc: torch.Tensor | None = None
        self._rows_version: int | None = None
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def for_group(cls, cp_size: int) -> type:
        """A subclass whose ``cp_size`` default is this: SGLang builds it with the in-tree arguments only.

        Raises: ConfigError for a bad ``cp_size``.
        """
        attrs = {"default_cp_size": check_cp_size(cp_size), "__module__": cls.__module__}
        return type(f"{cls.__name__}CP{int(cp_size)}", (cls,), attrs)

    def owned_rows(self, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(index, rows)``: positions in ``loc`` (any ``[n]`` integer tensor of group slots, -1 padding
        skipped) of the tokens on this rank's lane, int64 ``[k]``, and their rows in its buffer,
        ``write_slots``, int64 ``[k]``, all ``< Q * page_size``; on ``loc``'s device.

        Every layer of a forward writes through the same ``out_cache_loc`` tensor: the result for the latest
        tensor is kept, with a reference to it (so its memory cannot be reused by another tensor), and reused
        while it is that very tensor, unmodified (``_version``): the translation and its device-to-host sync
        run once a batch, not once a layer.

        Raises: LayoutError for a slot past the group's ``C * Q * page_size``.
        """
        rows = self._rows
        if rows is not None and self._rows_loc is loc and self._rows_version == loc._version:
            return rows
        flat = loc.reshape(-1).to(torch.int64)
        index = self.layout.owned_mask(flat, self.cp_rank).nonzero().reshape(-1)
        rows = self._rows = (index, self.layout.write_slots(flat.index_select(0, index)))
        self._rows_loc, self._rows_version = loc, loc._version
        return rows

    # SGLang's other writers address rows by group slot and move rows between slots that may lie on other
    # ranks (retraction offload re-allocates, speculative moves): refused at C > 1, never written past the
    # buffer or onto another rank's rows.
    def get_cpu_copy(self, indices, *args, **kwargs):
        """SGLang's retraction offload copy; ConfigError at C > 1 (its reload takes new slots, on any lane)."""
        self._refuse("get_cpu_copy (retraction with KV offload)")
        return super().get_cpu_copy(indices, *args, **kwargs)

    def load_cpu_copy(self, kv_cache_cpu, indices, *args, **kwargs):
        """SGLang's retraction reload; ConfigError at C > 1 (as ``get_cpu_copy``)."""
        self._refuse("load_cpu_copy (retraction with KV offload)")
        return super().load_cpu_copy(kv_cache_cpu, indices, *args, **kwargs)

    def move_kv_cache(self, tgt_loc, src_loc):
        """SGLang's slot-to-slot move (speculative decoding); ConfigError at C > 1 (a pair may cross ranks)."""
        self._refuse("move_kv_cache (speculative decoding's slot moves)")
        return super().move_kv_cache(tgt_loc, src_loc)

    def _refuse(self, what: str) -> None:
        if self.cp_size > 1:
            raise ConfigError(
                f"{what} moves KV rows by group slot, which cpkv's owner lanes do not serve at "
                f"cp_size={self.cp_size}: a slot's rows live only on its owner rank"
            )

    def _owned(self, loc: torch.Tensor, *rows: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """This rank's buffer rows and the matching rows of each tensor (``[len(loc), ...]``)."""
        for t in rows:
            if t.shape[0] != loc.numel():
                raise LayoutError(
                    f"{t.shape[0]} K/V rows for {loc.numel()} slots of out_cache_loc: "
                    "pass one row per slot (the whole batch, or this rank's tokens)"
                )
        index, local = self.owned_rows(loc)
        return local, [t.index_select(0, index.to(t.device)) for t in rows]


class OwnerLaneMHATokenToKVPool(OwnerLaneKVPoolMixin, MHATokenToKVPool):
    """SGLang's MHA/GQA pool; each rank stores the K and V rows of its own lane (class docstring above)."""

    def set_kv_buffer(
        self,
        layer,
        loc_info,
        cache_k,
        cache_v,
        k_scale=None,
        v_scale=None,
        layer_id_override=None,
        dcp_kv_mask=None,
    ):
        """SGLang's write door: ``cache_k`` ``[n, H, D]`` and ``cache_v`` ``[n, H, Dv]`` for the ``n`` slots of
        ``loc_info`` (an ``out_cache_loc`` tensor or ``KVWriteLoc``); rows off this rank's lane are skipped.

        Raises: LayoutError for a row count other than ``n`` or a slot past the group; ConfigError for a
        DCP mask (decode CP is not an owner-lane layout).
        """
        if dcp_kv_mask is not None:
            raise ConfigError(
                "dcp_kv_mask is set: decode context parallelism (--dcp-size) does not combine "
                "with cpkv's owner lanes"
            )
        loc, _, _ = unwrap_write_loc(loc_info)
        rows, (k, v) = self._owned(loc, cache_k, cache_v)
        if rows.numel():
            super().set_kv_buffer(layer, rows, k, v, k_scale, v_scale, layer_id_override)

    def set_kv_buffer_prefix_valid(self, *args, **kwargs):
        """SGLang's 2-D write door (speculative draft rows); ConfigError at C > 1, as ``move_kv_cache``."""
        self._refuse("set_kv_buffer_prefix_valid (speculative draft rows)")
        return super().set_kv_buffer_prefix_valid(*args, **kwargs)


class OwnerLaneMLATokenToKVPool(OwnerLaneKVPoolMixin, MLATokenToKVPool):
    """SGLang's MLA latent pool; each rank stores the latent rows of its own lane."""

    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v, layer_id_override=None):
        """``cache_k`` ``[n, 1, kv_cache_dim]`` latent rows for the ``n`` slots (``cache_v`` unused, as in
        SGLang's MLA pool). Raises as ``OwnerLaneMHATokenToKVPool.set_kv_buffer``."""
        loc, _, _ = unwrap_write_loc(loc_info)
        rows, (k,) = self._owned(loc, cache_k)
        if rows.numel():
            super().set_kv_buffer(layer, rows, k, cache_v, layer_id_override)

    def set_mla_kv_buffer(self, layer, loc_info, cache_k_nope, cache_k_rope, layer_id_override=None):
        """``cache_k_nope`` ``[n, 1, kv_lora_rank]`` and ``cache_k_rope`` ``[n, 1, qk_rope_head_dim]`` for the
        ``n`` slots. Raises as ``set_kv_buffer``."""
        loc, _, _ = unwrap_write_loc(loc_info)
        rows, (nope, rope) = self._owned(loc, cache_k_nope, cache_k_rope)
        if rows.numel():
            super().set_mla_kv_buffer(layer, rows, nope, rope, layer_id_override)


class OwnerLaneDSATokenToKVPool(OwnerLaneMLATokenToKVPool, DSATokenToKVPool):
    """SGLang's DSA (NSA) pool: the MLA latent rows as ``OwnerLaneMLATokenToKVPool``. The indexer keys are
    written by the NSA kernels (a GPU), not through this door."""


POOL_CLASSES = {
    "mha": OwnerLaneMHATokenToKVPool,
    "mla": OwnerLaneMLATokenToKVPool,
    "dsa": OwnerLaneDSATokenToKVPool,
}
"""SGLang's ``KVPoolKind`` -> cpkv's pool class (``get_kv_pool_cls``)."""


def write_kv_rows(
    pools: Sequence,
    layer,
    out_cache_loc: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor | None = None,
) -> None:
    """Write one batch's K/V rows on every rank through the pools' own ``set_kv_buffer`` (what SGLang's
    attention layer calls on each rank with the all-gathered rows).

    Args:
        pools: the C ranks' pools, ``pools[r].cp_rank == r``, one group.
        layer: anything with ``layer_id`` (SGLang passes its ``RadixAttention``).
        out_cache_loc: ``[n]`` int64 group slots of the batch (the allocator's ``out_cache_loc``).
        cache_k, cache_v: ``[n, ...]`` rows per slot (MLA: ``cache_k`` the latent rows, ``cache_v`` None).

    Raises:
        ConfigError: ``pools`` not ranks ``0 .. C-1`` of one group. LayoutError: as ``set_kv_buffer``.
    """
    _check_group(pools)
    for pool in pools:
        pool.set_kv_buffer(layer, out_cache_loc, cache_k, cache_v)


def read_kv_rows(pools: Sequence, layer_id: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, v)`` rows of these group slots, read from the rank-major view at ``read_slots`` (C-LAYOUT).

    Args:
        pools: the C ranks' pools (as ``write_kv_rows``). layer_id: SGLang's layer id.
        slots: ``[m]`` integer group slots (no -1).

    Returns:
        ``get_key_buffer`` / ``get_value_buffer`` rows, ``[m, ...]`` each (MLA: the latent rows and their
        first ``kv_lora_rank`` columns), the pools' dtype and device.

    Raises:
        ConfigError: as ``write_kv_rows``. LayoutError: a slot past the group, or a negative one.
    """
    layout = _check_group(pools)
    slots = slots.reshape(-1).to(torch.int64)
    if slots.numel() and int(slots.min()) < 0:
        raise LayoutError(f"slot {int(slots.min())} is padding: read_kv_rows reads held slots only")
    n = layout.lane_slots  # rows of one lane: Q * page_size
    rows = layout.read_slots(slots)
    out = []
    for get in ("get_key_buffer", "get_value_buffer"):
        view = torch.cat([getattr(pool, get)(layer_id)[:n] for pool in pools])  # [C * Q * P, ...] rank-major
        out.append(view.index_select(0, rows.to(view.device)))
    return out[0], out[1]


def _check_group(pools: Sequence) -> SharedKVLayout:
    """The group's layout when ``pools`` are ranks ``0 .. C-1`` of one layout; ConfigError otherwise."""
    layouts = {pool.layout for pool in pools}
    ranks = [pool.cp_rank for pool in pools]
    if len(layouts) != 1 or ranks != list(range(len(pools))) or len(pools) != pools[0].cp_size:
        raise ConfigError(
            f"pools must be ranks 0 .. C-1 of one group, got ranks {ranks} of "
            f"{sorted({(lay.cp_size, lay.pages_per_lane) for lay in layouts})} (cp_size, pages_per_lane)"
        )
    return layouts.pop()
