"""Rank-major shared KV layout: lanes, write slots, read slots, owned masks (SPEC C-LAYOUT, C-POOL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import check_cp_size, check_int, check_lane
from .errors import ConfigError, LayoutError, PoolKindError
from .validate import MAX_POSITION

POOL_KINDS = ("sharded", "replicated")
"""KV pool kinds (SPEC C-POOL): ``sharded`` (each page on its owner lane) or ``replicated`` (every rank
holds every page)."""


def check_pool_kind(kind: object) -> str:
    """``kind`` when it is one of ``POOL_KINDS``, else ConfigError naming the value (SPEC C-POOL)."""
    if not isinstance(kind, str) or kind not in POOL_KINDS:
        raise ConfigError(f"pool kind={kind!r} is unknown; use one of {', '.join(POOL_KINDS)}")
    return kind


def _is_torch(x: object) -> bool:
    return hasattr(x, "detach") and hasattr(x, "device")


def _on_host(tensor) -> bool:
    """Whether reading a value of ``tensor`` costs no device sync (a CPU tensor)."""
    return tensor.device.type == "cpu"


def _assert_on_device(ok, message: str) -> None:
    """Queue the check ``ok`` (a 0-d bool tensor) on its device, without a sync: CUDA raises a device-side
    assert at the next sync when it is False (fatal to the CUDA context); a CPU tensor raises RuntimeError
    at once."""
    import torch

    try:
        torch._assert_async(ok, message)
    except TypeError:  # a torch without the message argument
        torch._assert_async(ok)


@dataclass(frozen=True)
class SharedKVLayout:
    """Slot translations between the logical pool, a rank's own lane and the rank-major view (C-LAYOUT).

    The logical pool has ``C * Q`` pages of P slots; page p lives on lane ``p % C`` at local page
    ``p // C``. The rank-major view concatenates the lanes: lane r's segment starts at row ``r * Q * P``.
    Example C=4, P=64, Q=8: slots ``[0, 63, 64, 65, 128, 197, 512, -1]`` read at
    ``[0, 63, 512, 513, 1024, 1541, 128, -1]`` and write at ``[0, 63, 0, 1, 0, 5, 128, -1]``.

    Every translation accepts a numpy array or torch tensor of any integer dtype on any device (or a
    Python sequence, treated as numpy) and returns the same type, dtype and device. Negative slots (the
    ``-1`` padding sentinel) pass through unchanged. ``out=`` (optional) is a preallocated result of the
    same type, dtype, shape and device, C-contiguous, writable and sharing no memory with ``slots``; the
    translation writes into it and returns it, so repeated translations allocate nothing (if it raises,
    ``out`` may hold part of the result; ``slots`` is never changed).

    Range checks never sync a device: on the host a slot ``>= num_slots`` raises LayoutError; on CUDA the
    check is queued (``torch._assert_async``, a device-side assert at the next sync) unless ``check=False``,
    where the caller vouches for its slots. A ``replicated`` pool (C-POOL) translates as C = 1 on every rank;
    its ``lane_of`` and ``owned_mask`` raise ``PoolKindError``.

    Attributes:
        cp_size: lanes (C >= 1). page_size: slots per page (P >= 1). pages_per_lane: pages per lane (Q >= 1);
        in a replicated pool, the pages of the pool, held by every rank.
        kind: ``"sharded"`` (default) or ``"replicated"`` (C-POOL).

    Raises:
        ConfigError: a size below 1, an unknown ``kind``. LayoutError: a slot ``>= num_slots``, a result that
        overflows the dtype, or an ``out`` of another type, dtype, shape or device, not contiguous, read-only
        or overlapping ``slots``, a ``meta`` tensor. PoolKindError: an owner translation of a replicated pool.
    """

    cp_size: int
    page_size: int
    pages_per_lane: int
    kind: str = "sharded"

    def __post_init__(self) -> None:
        object.__setattr__(self, "cp_size", check_cp_size(self.cp_size))
        object.__setattr__(self, "page_size", check_int("page_size", self.page_size, 1))
        object.__setattr__(self, "pages_per_lane", check_int("pages_per_lane", self.pages_per_lane, 1))
        check_pool_kind(self.kind)
        if self.cp_size * self.pages_per_lane * self.page_size > MAX_POSITION:  # slots stay exact in int64
            raise LayoutError(
                f"a pool of cp_size={self.cp_size} x pages_per_lane={self.pages_per_lane} x page_size="
                f"{self.page_size} slots exceeds {MAX_POSITION} (2**53), the most slots cpkv addresses"
            )

    @property
    def num_slots(self) -> int:
        """Slots in the whole pool and rows of the rank-major buffer: ``C * Q * P`` (replicated: ``Q * P``)."""
        return (self.cp_size if self.kind == "sharded" else 1) * self.pages_per_lane * self.page_size

    @property
    def lane_slots(self) -> int:
        """Slots (rows) of one lane: ``Q * P``."""
        return self.pages_per_lane * self.page_size

    def lane_of(self, slots, out=None, *, check: bool = True):
        """Owner lane of each slot, ``(slot // P) % C`` (C-LAYOUT); negative slots unchanged.

        Args: ``slots`` any shape, integer numpy array / torch tensor / Python sequence (slots); ``out`` an
        optional preallocated result (see the class docstring).
        Returns: the same type, dtype, shape and device (``out`` when given). Raises: LayoutError (non-integer
        dtype, slot >= C*Q*P, a bad ``out``); PoolKindError on a replicated pool (C-POOL).
        """
        self._require_owners("lane_of")
        return self._translate(slots, "lane", lambda s, p, o: p % self.cp_size, out, check)

    def write_slots(self, slots, out=None, *, check: bool = True):
        """Row of each slot in its owner's own lane buffer, ``(p // C) * P + o`` (C-LAYOUT, direct write).

        Args: ``slots`` any shape, integer numpy array / torch tensor / Python sequence; -1 passes through;
        ``out`` an optional preallocated result (see the class docstring).
        Returns: rows in ``[0, Q*P)``, same type, dtype, shape and device (``out`` when given).
        Raises: LayoutError as ``lane_of``. Replicated pool (C-POOL): the slot itself, the row in every
        rank's full copy.
        """
        if self.kind == "replicated":
            return self._same_slots(slots, out, check)
        return self._translate(
            slots, "write", lambda s, p, o: (p // self.cp_size) * self.page_size + o, out, check
        )

    def read_slots(self, slots, out=None, *, check: bool = True):
        """Row of each slot in the rank-major view, ``((p % C) * Q + p // C) * P + o`` (C-LAYOUT).

        Args: ``slots`` any shape, integer numpy array / torch tensor / Python sequence; -1 passes through;
        ``out`` an optional preallocated result (see the class docstring).
        Returns: rows in ``[0, C*Q*P)``, same type, dtype, shape and device (``out`` when given).
        Raises: LayoutError as ``lane_of``, or when a row does not fit the input dtype. Replicated pool
        (C-POOL): the slot itself.
        """
        if self.kind == "replicated":
            return self._same_slots(slots, out, check)
        C, Q, P = self.cp_size, self.pages_per_lane, self.page_size
        return self._translate(slots, "read", lambda s, p, o: ((p % C) * Q + p // C) * P + o, out, check)

    def owned_mask(self, slots, rank: int, *, check: bool = True):
        """Bool mask, same shape: ``slot >= 0 and lane(slot) == rank`` (C-LAYOUT); numpy in, numpy out.

        Raises: LayoutError for ``rank`` not an integer (a bool included) or outside ``[0, C)``, or bad slots (as ``lane_of``); PoolKindError on a
        replicated pool, where no owner filter applies (C-POOL).
        """
        self._require_owners("owned_mask")
        rank = check_lane("rank", rank, self.cp_size, LayoutError)
        slots = self._check(slots, check)
        wide = slots.to(_torch_int64()) if _is_torch(slots) else slots.astype(np.int64, copy=False)
        return (wide >= 0) & ((wide // self.page_size) % self.cp_size == rank)  # int64: no dtype overflow

    def check_slots(self, slots, check: bool = True):
        """``slots`` (integer numpy array, torch tensor or sequence) checked as every translation checks them:
        LayoutError for a non-integer dtype, a ``meta`` tensor or (on the host) a slot ``>= num_slots``; on
        another device the range check is queued there (no sync), or skipped with ``check=False``.
        Returns the slots (a sequence as numpy)."""
        return self._check(slots, check)

    def _require_owners(self, what: str) -> None:
        """PoolKindError when this pool is replicated: it has no owner lanes to translate to (C-POOL)."""
        if self.kind == "replicated":
            raise PoolKindError(
                f"{what} is an owner translation, but this pool is replicated (cp_size={self.cp_size}, "
                f"pages_per_lane={self.pages_per_lane}): every rank holds every page; use read_slots/write_slots "
                f"(the slot itself) and no owner filter"
            )

    def _same_slots(self, slots, out=None, check: bool = True):
        """A replicated pool's translation (C = 1 on every rank): a copy of the checked ``slots`` (into
        ``out`` when given)."""
        slots = self._check(slots, check)
        if out is None:
            return slots.clone() if _is_torch(slots) else slots.copy()
        _check_out(slots, out)
        out.copy_(slots) if _is_torch(slots) else np.copyto(out, slots)
        return out

    def _check(self, slots, check: bool = True):
        """``slots`` as an integer numpy array or torch tensor, all ``< C*Q*P``; else LayoutError (on a device
        other than the CPU the range check is queued there, or skipped with ``check=False``: no sync)."""
        if _is_torch(slots):
            import torch

            if slots.device.type == "meta":
                raise LayoutError(
                    f"slots are a meta tensor {tuple(slots.shape)} {slots.dtype}: it holds no slot values to "
                    "translate; pass a tensor on a real device (cpu, cuda)"
                )
            dt = slots.dtype
            if dt.is_floating_point or dt.is_complex or dt == torch.bool:
                raise LayoutError(f"slots must have an integer dtype, got {dt}")
            n = slots.numel()
            if n and not _on_host(slots):
                if check:
                    top = slots.max().to(torch.int64)  # compared in int64: num_slots may not fit the dtype
                    _assert_on_device(top < self.num_slots, self._range_text("a slot"))
                return slots
        else:
            if not isinstance(slots, np.ndarray):
                slots = np.asarray(slots)
                if slots.size == 0:
                    slots = slots.astype(np.int64)
            if not np.issubdtype(slots.dtype, np.integer):
                raise LayoutError(f"slots must have an integer dtype, got {slots.dtype}")
            n = slots.size
        if n and int(slots.max()) >= self.num_slots:
            raise LayoutError(self._range_text(f"slot {int(slots.max())}"))
        return slots

    def _range_text(self, what: str) -> str:
        return (
            f"{what} out of range: the pool has {self.num_slots} slots ("
            + (f"cp_size={self.cp_size} x " if self.kind == "sharded" else "replicated: ")
            + f"pages_per_lane={self.pages_per_lane} x page_size={self.page_size})"
        )

    def _translate(self, slots, kind: str, fn, out=None, check: bool = True):
        """numpy arrays and CPU tensors: the blocked kernel ``_translate_numpy``; other devices, and any
        input the kernel finds out of range or overflowing, take ``_map`` (the formula ``fn`` as written,
        which raises the errors). With ``out``, the result is written into it."""
        torch_in = _is_torch(slots)
        if not torch_in and not isinstance(slots, np.ndarray):
            slots = self._check(slots)  # a Python sequence: as numpy, integers only
        if out is not None:
            _check_out(slots, out)
        if torch_in:
            import torch

            numpy_dtypes = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
            if _on_host(slots) and slots.dtype in numpy_dtypes:  # zero-copy numpy views
                res = self._translate_numpy(slots.numpy(), kind, None if out is None else out.numpy())
                if res is not None:
                    return out if out is not None else torch.from_numpy(res)
        elif np.issubdtype(slots.dtype, np.integer):
            res = self._translate_numpy(slots, kind, out)
            if res is not None:
                return res
        res = self._map(slots, fn, check)
        if out is None:
            return res
        out.copy_(res) if torch_in else np.copyto(out, res)
        return out

    def _translate_numpy(
        self, slots: np.ndarray, kind: str, out: np.ndarray | None = None
    ) -> np.ndarray | None:
        """``kind`` ("lane", "write" or "read") of integer ``slots``, same dtype and shape, written into
        ``out`` (C-contiguous, same dtype and shape) or a new array; None when a slot is ``>= C*Q*P`` or a
        result may not fit the dtype (the caller then takes the formula path).

        Works on blocks of at most ``_BLOCK`` slots and ``_BLOCK_BYTES`` of input so that the block and every
        temporary stay in L2: one read of the input, one write of the output. With page ``p = s // P`` and local page ``l = p // C``: lane ``p - l*C``,
        write ``s - (p - l)*P``, read ``s + p*(Q-1)*P - l*(C*Q-1)*P``. The arithmetic runs in int32 when
        ``C*Q*P`` fits: it wraps modulo 2**32, and the result lies in ``[0, C*Q*P)``, so it is exact.
        Example C=4, P=64, Q=8, s=197: p=3, l=0 -> lane 3, write 197-192 = 5, read 197+3*448 = 1541.
        """
        C, P, Q, n_slots = self.cp_size, self.page_size, self.pages_per_lane, self.num_slots
        work = np.int32 if n_slots <= np.iinfo(np.int32).max else np.int64
        src = slots.reshape(-1)
        if out is None:
            out = np.empty(slots.shape, dtype=slots.dtype)
        dst_all = out.reshape(-1)  # a view: out is C-contiguous
        direct = slots.dtype == work  # compute straight from the input into the output
        signed = np.issubdtype(slots.dtype, np.signedinteger)
        fits = kind == "lane" or _int_max(slots.dtype) >= n_slots - 1
        block = min(_BLOCK, _BLOCK_BYTES // slots.dtype.itemsize)  # int64 input: 32K slots; narrower: 64K
        size = min(block, src.shape[0])
        x, p, local, r = (np.empty(size, dtype=work) for _ in range(4))
        neg = np.empty(size, dtype=bool)
        for i in range(0, src.shape[0], block):
            blk, dst = src[i : i + block], dst_all[i : i + block]
            k = blk.shape[0]
            if int(blk.max()) >= n_slots:
                return None
            xb, res = (blk, dst) if direct else (x[:k], r[:k])
            pb, lb = p[:k], local[:k]
            if not direct:
                np.copyto(xb, blk, casting="unsafe")  # slots < C*Q*P fit; negatives are restored below
            _floor_div(xb, P, pb)
            _floor_div(pb, C, lb)
            if kind == "lane":
                np.multiply(lb, C, out=lb)
                np.subtract(pb, lb, out=res)
            elif kind == "write":
                np.subtract(pb, lb, out=pb)
                np.multiply(pb, P, out=pb)
                np.subtract(xb, pb, out=res)
            else:
                np.multiply(pb, (Q - 1) * P, out=pb)
                np.multiply(lb, (C * Q - 1) * P, out=lb)
                np.subtract(pb, lb, out=pb)
                np.add(xb, pb, out=res)
            if not direct:
                if not fits and int(res.max()) > _int_max(slots.dtype):
                    return None  # (res at negative slots is noise: the formula path decides)
                np.copyto(dst, res, casting="unsafe")
            if signed:
                nb = neg[:k]
                np.less(blk, 0, out=nb)
                if nb.any():
                    np.copyto(dst, blk, where=nb)  # negative slots pass through
        return out

    def _map(self, slots, fn, check: bool = True):
        slots = self._check(slots, check)
        out: Any  # a tensor or an array, as slots
        if _is_torch(slots):
            import torch

            s = slots.to(torch.int64)
            out = torch.where(s >= 0, fn(s, s // self.page_size, s % self.page_size), s)
        else:
            s = slots.astype(np.int64, copy=False)
            out = np.where(s >= 0, fn(s, s // self.page_size, s % self.page_size), s)
        if out.dtype != slots.dtype:
            if _is_torch(out) and out.numel() and not _on_host(out):  # queued on the device: no sync
                if check:
                    fits = out.max() <= _int_max(slots.dtype)
                    _assert_on_device(fits, f"a translated slot does not fit {slots.dtype}")
            elif (out.numel() if _is_torch(out) else out.size) and int(out.max()) > _int_max(slots.dtype):
                raise LayoutError(f"translated slot {int(out.max())} does not fit dtype {slots.dtype}")
            out = out.to(slots.dtype) if _is_torch(out) else out.astype(slots.dtype)
        return out


_BLOCK = 1 << 16  # most slots per block of _translate_numpy ...
_BLOCK_BYTES = 1 << 18  # ... and most input bytes: block, output and temporaries (~1.5 MiB) stay in L2


def _check_out(slots, out) -> None:
    """LayoutError unless ``out`` can take the translation of ``slots``: the same type (numpy / torch),
    dtype, shape and device, C-contiguous, writable, and no memory shared with ``slots``."""
    if _is_torch(slots):
        if not _is_torch(out):
            raise LayoutError(f"out must be a torch tensor like slots, got {type(out).__name__}")
        if out.dtype != slots.dtype or out.shape != slots.shape or out.device != slots.device:
            raise LayoutError(
                f"out is {out.dtype} {tuple(out.shape)} on {out.device}, but slots are {slots.dtype} "
                f"{tuple(slots.shape)} on {slots.device}"
            )
        if not out.is_contiguous():
            raise LayoutError(f"out must be contiguous (strides {out.stride()})")
        if (
            out.numel()
            and slots.numel()
            and out.untyped_storage().data_ptr() == slots.untyped_storage().data_ptr()
        ):
            raise LayoutError("out shares memory with slots; translate into a separate buffer")
        return
    if not isinstance(out, np.ndarray):
        raise LayoutError(f"out must be a numpy array like slots, got {type(out).__name__}")
    if out.dtype != slots.dtype or out.shape != slots.shape:
        raise LayoutError(f"out is {out.dtype} {out.shape}, but slots are {slots.dtype} {slots.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise LayoutError("out must be C-contiguous and writable")
    if np.may_share_memory(out, slots):
        raise LayoutError("out shares memory with slots; translate into a separate buffer")


def _torch_int64():
    import torch

    return torch.int64


def _floor_div(x: np.ndarray, d: int, out: np.ndarray) -> None:
    """``out = x // d`` (floor, also for negative x); a shift when d is a power of two."""
    if d & (d - 1) == 0:
        np.right_shift(x, d.bit_length() - 1, out=out)
    else:
        np.floor_divide(x, d, out=out)


def _int_max(dtype) -> int:
    if isinstance(dtype, np.dtype):
        return int(np.iinfo(dtype).max)
    import torch

    return int(torch.iinfo(dtype).max)
