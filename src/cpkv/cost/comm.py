"""Communication prices of one GPU system from aiconfigurator's measured NCCL tables (SPEC C-COST).

The tables time NCCL collectives (``all_gather``, ``reduce_scatter``, ``all_reduce``) of 2, 4 and 8 GPUs of
one node over message sizes from 256 elements to 512 MiB (aiconfigurator extrapolates past 8 GPUs with
its inter-node model). A table's message size is the whole buffer of the collective (all ranks' shares of
an all-gather), in 16-bit elements. Prices here take bytes and are monotone in them (``grid.Curve``).

Point-to-point reads (a rank reading other lanes' KV through the rank-major view, C-LAYOUT) have no
table of their own; they are priced as the all-gather in which every rank receives the same bytes, so
they move at the measured NVLink bandwidth of a collective of that size.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .grid import Curve

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
ELEMENT_BYTES = 2
"""Bytes of one element of the measured messages (NCCL ``half``)."""

_ELEMENTS = np.unique(
    np.r_[2.0 ** np.arange(4, 31), 3.0 * 2.0 ** np.arange(3, 29)]
)  # 16 .. 1 Gi elements (2 GiB)


class CommCost:
    """Collective and point-to-point prices (ms) of one GPU system (SPEC C-COST).

    Args:
        sample: ``sample(op, num_gpus, elements) -> latencies``: measured ms of collective ``op`` (one of
            ``COLLECTIVES``) over ``num_gpus`` GPUs for each whole-buffer size in ``elements`` (float
            ``[n]``, 16-bit elements). Called once per (op, num_gpus), then kept.

    Every method takes sizes in bytes, as a number or an array (then returns an array), and gives 0.0 where
    nothing moves (``cp_size`` 1 or 0 bytes). Raises ``CostModelError`` (from ``sample``) where the tables
    have no measurement for ``cp_size`` GPUs.
    """

    def __init__(self, sample: Callable[[str, int, np.ndarray], np.ndarray]) -> None:
        self._sample = sample
        self._curves: dict[tuple[str, int], Curve] = {}

    def curve(self, op: str, num_gpus: int) -> Curve:
        """The price of collective ``op`` over ``num_gpus`` GPUs, by whole-buffer size in elements."""
        if op not in COLLECTIVES:
            raise ValueError(f"collective {op!r} is not one of {COLLECTIVES}")
        key = (op, int(num_gpus))
        if key not in self._curves:
            self._curves[key] = Curve(_ELEMENTS, self._sample(op, key[1], _ELEMENTS))
        return self._curves[key]

    def _price(self, op: str, total_bytes, num_gpus: int):
        total = np.asarray(total_bytes, dtype=np.float64)
        if num_gpus <= 1:
            out = np.zeros_like(total)
        else:
            out = np.where(total > 0, self.curve(op, num_gpus)(total / ELEMENT_BYTES), 0.0)
        return float(out) if out.ndim == 0 else out

    def allgather_ms(self, bytes_per_rank, cp_size: int):
        """All-gather of ``cp_size`` buffers of ``bytes_per_rank`` bytes each (every rank ends with all of
        them, ``cp_size * bytes_per_rank``): e.g. the gather-back of hidden states (C-GATHER, ``M`` rows
        per rank) or a per-layer all-gather of the extend's KV rows."""
        return self._price("all_gather", np.asarray(bytes_per_rank, dtype=np.float64) * cp_size, cp_size)

    def reduce_scatter_ms(self, bytes_per_rank, cp_size: int):
        """Reduce-scatter ending with ``bytes_per_rank`` bytes on each of ``cp_size`` ranks (a buffer of
        ``cp_size * bytes_per_rank`` bytes reduced over the group)."""
        return self._price("reduce_scatter", np.asarray(bytes_per_rank, dtype=np.float64) * cp_size, cp_size)

    def allreduce_ms(self, nbytes, cp_size: int):
        """All-reduce of an ``nbytes`` buffer over ``cp_size`` ranks."""
        return self._price("all_reduce", nbytes, cp_size)

    def remote_read_ms(self, nbytes, cp_size: int):
        """Every rank of the group reads ``nbytes`` bytes in all from the other ``cp_size - 1`` lanes, spread
        evenly (owner-lane attention reading keys through the rank-major view): priced as the all-gather in
        which each rank receives ``nbytes``, ``nbytes / (cp_size - 1)`` from each peer."""
        if cp_size <= 1:
            return self._price("all_gather", nbytes, 1)
        return self.allgather_ms(np.asarray(nbytes, dtype=np.float64) / (cp_size - 1), cp_size)

    def p2p_ms(self, nbytes):
        """One rank reading ``nbytes`` bytes from one peer of its node (the two-GPU all-gather in which each
        receives ``nbytes``)."""
        return self.allgather_ms(nbytes, 2)
