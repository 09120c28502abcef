"""Rank-major shared KV layout: lanes, write slots, read slots, owned masks (SPEC C-LAYOUT)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import check_int
from .errors import LayoutError


def _is_torch(x: object) -> bool:
    return hasattr(x, "detach") and hasattr(x, "device")


@dataclass(frozen=True)
class SharedKVLayout:
    """Slot translations between the logical pool, a rank's own lane and the rank-major view (C-LAYOUT).

    The logical pool has ``C * Q`` pages of P slots; page p lives on lane ``p % C`` at local page
    ``p // C``. The rank-major view concatenates the lanes: lane r's segment starts at row ``r * Q * P``.
    Example C=4, P=64, Q=8: slots ``[0, 63, 64, 65, 128, 197, 512, -1]`` read at
    ``[0, 63, 512, 513, 1024, 1541, 128, -1]`` and write at ``[0, 63, 0, 1, 0, 5, 128, -1]``.

    Every translation accepts a numpy array or torch tensor of any integer dtype on any device (or a
    Python sequence, treated as numpy) and returns the same type, dtype and device. Negative slots (the
    ``-1`` padding sentinel) pass through unchanged.

    Attributes:
        cp_size: lanes (C >= 1). page_size: slots per page (P >= 1). pages_per_lane: pages per lane (Q >= 1).

    Raises:
        ConfigError: a size below 1. LayoutError: a slot ``>= C*Q*P`` or a result that overflows the dtype.
    """

    cp_size: int
    page_size: int
    pages_per_lane: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "cp_size", check_int("cp_size", self.cp_size, 1))
        object.__setattr__(self, "page_size", check_int("page_size", self.page_size, 1))
        object.__setattr__(self, "pages_per_lane", check_int("pages_per_lane", self.pages_per_lane, 1))

    @property
    def num_slots(self) -> int:
        """Slots in the whole pool and rows of the rank-major buffer: ``C * Q * P``."""
        return self.cp_size * self.pages_per_lane * self.page_size

    @property
    def lane_slots(self) -> int:
        """Slots (rows) of one lane: ``Q * P``."""
        return self.pages_per_lane * self.page_size

    def lane_of(self, slots):
        """Owner lane of each slot, ``(slot // P) % C``; negative slots unchanged. Same type/dtype/device."""
        return self._map(slots, lambda s, p, o: p % self.cp_size)

    def write_slots(self, slots):
        """Row in the owner's own lane buffer, ``(p // C) * P + o``; negative slots unchanged."""
        return self._map(slots, lambda s, p, o: (p // self.cp_size) * self.page_size + o)

    def read_slots(self, slots):
        """Row in the rank-major view, ``((p % C) * Q + p // C) * P + o``; negative slots unchanged."""
        C, Q, P = self.cp_size, self.pages_per_lane, self.page_size
        return self._map(slots, lambda s, p, o: ((p % C) * Q + p // C) * P + o)

    def owned_mask(self, slots, rank: int):
        """Bool mask, same shape: ``slot >= 0 and lane(slot) == rank``. numpy in, numpy out; torch likewise."""
        rank = check_int("rank", rank, 0)
        if rank >= self.cp_size:
            raise LayoutError(f"rank={rank} out of range [0, {self.cp_size})")
        slots = self._check(slots)
        return (slots >= 0) & ((slots // self.page_size) % self.cp_size == rank)

    def _check(self, slots):
        """``slots`` as an integer numpy array or torch tensor, all ``< C*Q*P``; else LayoutError."""
        if _is_torch(slots):
            import torch

            dt = slots.dtype
            if dt.is_floating_point or dt.is_complex or dt == torch.bool:
                raise LayoutError(f"slots must have an integer dtype, got {dt}")
            n = slots.numel()
        else:
            if not isinstance(slots, np.ndarray):
                slots = np.asarray(slots, dtype=np.int64)
            if not np.issubdtype(slots.dtype, np.integer):
                raise LayoutError(f"slots must have an integer dtype, got {slots.dtype}")
            n = slots.size
        if n and int(slots.max()) >= self.num_slots:
            raise LayoutError(
                f"slot {int(slots.max())} out of range: the pool has {self.num_slots} slots "
                f"(cp_size={self.cp_size} x pages_per_lane={self.pages_per_lane} x page_size={self.page_size})"
            )
        return slots

    def _map(self, slots, fn):
        slots = self._check(slots)
        if _is_torch(slots):
            import torch

            s = slots.to(torch.int64)
            out = torch.where(s >= 0, fn(s, s // self.page_size, s % self.page_size), s)
        else:
            s = slots.astype(np.int64, copy=False)
            out = np.where(s >= 0, fn(s, s // self.page_size, s % self.page_size), s)
        if out.dtype != slots.dtype:
            if (out.numel() if _is_torch(out) else out.size) and int(out.max()) > _int_max(slots.dtype):
                raise LayoutError(f"translated slot {int(out.max())} does not fit dtype {slots.dtype}")
            out = out.to(slots.dtype) if _is_torch(out) else out.astype(slots.dtype)
        return out


def _int_max(dtype) -> int:
    if isinstance(dtype, np.dtype):
        return int(np.iinfo(dtype).max)
    import torch

    return int(torch.iinfo(dtype).max)
