"""Rank-major paged KV buffer of the CP group (SPEC C-LAYOUT, section 3).

One buffer of ``C * pages_per_lane * page_size`` rows per layer; lane r is rows ``[r*Q*P, (r+1)*Q*P)``.
A rank writes only its own lane, at ``layout.write_slots(slots)`` of the lane view, and reads any row of
the whole view at ``layout.read_slots(slots)``. Writes and reads of a layer are separated by the write
fence (a collective: ``RankGroup.agree`` then ``publish``).

Three buffer kinds (``DistCase.kv_buffer``):

- ``shm`` (CPU, default with gloo): one file under ``/dev/shm`` (else the temp dir), created by rank 0 and
  mapped ``MAP_SHARED`` by every rank with ``torch.from_file(..., shared=True)``. A row a rank writes is
  the row its peers read: direct write, no copy. The file is unlinked as soon as every rank has mapped it
  (the mappings stay valid), and in a ``finally`` on every error path, so nothing is left in ``/dev/shm``.
- ``mirrored`` (the GPU alternative; also runs on CPU): the pool is still *sharded* by owner, but every rank
  keeps a mirror of the whole rank-major view in its own memory and writes only its own lane; ``publish``
  all-gathers the lanes in rank order into every mirror, which is exactly the rank-major layout. On GPUs
  a production engine would instead map the peers' lanes directly (CUDA IPC handles or
  ``torch.distributed._symmetric_memory``), keeping writes direct and reads remote; the mirrored form
  trades that for running on any NCCL group. (Not C-POOL's ``replicated`` pool kind, where every rank
  holds every page and slots translate as with C = 1: a mirrored pool keeps owner lanes.)

- ``local`` (``kv_access = local``, SPEC C-MERGE): a rank allocates only its own lane, ``[Q*P]`` rows per
  layer, in its own memory: no shared file, no mirror, no view of any other lane. It writes at
  ``write_slots`` and reads only slots it owns (at ``write_slots`` too); a read of another lane's slot is
  refused (``LaneReadError``). Attention over other lanes' keys is assembled from partials (``merge.py``).

Unwritten rows hold NaN, so a read of a row nobody wrote poisons the result instead of passing unnoticed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import check_int
from ..errors import ConfigError
from ..layout import SharedKVLayout
from ..limits import check_bytes
from .errors import LaneReadError, LaneWriteError
from .group import RankGroup

KV_BUFFERS = ("shm", "mirrored", "local")
FILE_PREFIX = "cpkv-kv-"


def shm_dir() -> Path:
    """Directory for the shared KV file: ``/dev/shm`` when it exists, else the system temp dir."""
    p = Path("/dev/shm")
    return p if p.is_dir() else Path(tempfile.gettempdir())


class KVBuffer:
    """All layers' rank-major KV rows as seen by one rank (SPEC C-LAYOUT).

    Attributes:
        layout: the ``SharedKVLayout`` (C, P, Q) of the pool.
        rank: this rank, i.e. the lane it may write.
        storage: ``[num_layers, C*Q*P, row_width]`` float32, the rank-major view (shared, or this rank's
            mirror); for ``local``, ``[num_layers, Q*P, row_width]``, this rank's lane only.
        kind: ``"shm"``, ``"mirrored"`` or ``"local"``.
    """

    def __init__(self, layout: SharedKVLayout, rank: int, storage: torch.Tensor, kind: str) -> None:
        self.layout, self.rank, self.storage, self.kind = layout, rank, storage, kind

    @property
    def num_layers(self) -> int:
        """Layers held."""
        return int(self.storage.shape[0])

    @property
    def holds_every_lane(self) -> bool:
        """Whether ``storage`` is the whole rank-major view (``shm``, ``mirrored``) or only the own lane."""
        return self.kind != "local"

    def lane_rows(self) -> tuple[int, int]:
        """``[start, end)`` rows of this rank's lane in ``storage``: ``r*Q*P .. (r+1)*Q*P`` (``local``: all)."""
        n = self.layout.lane_slots
        if not self.holds_every_lane:
            return 0, n
        return self.rank * n, (self.rank + 1) * n

    def lane(self, layer: int) -> torch.Tensor:
        """This rank's own segment of ``layer``: ``[Q*P, W]`` view, indexed by write slots."""
        a, b = self.lane_rows()
        return self.storage[layer, a:b]

    def write(self, layer: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write ``rows [n, W]`` of tokens at ``slots [n]`` (int64, global) into this rank's own lane.

        Goes through the lane view at ``layout.write_slots(slots)``, so no other lane can be touched.

        Raises:
            LaneWriteError: a slot is negative or not owned by this rank (owner != compute).
        """
        self._require_owned(
            slots, "write", LaneWriteError, "a rank writes only its own lane (C-OWNER-EQ-COMPUTE)"
        )
        self.lane(layer)[self.layout.write_slots(slots)] = rows

    def read(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Rows ``[k, W]`` of ``slots [k]`` (any lane) from the rank-major view at ``layout.read_slots``.

        Raises:
            LaneReadError: a ``local`` buffer and a slot of another lane (or negative).
        """
        return self.storage[layer][self.row_index(slots)]

    def row_index(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows of ``storage`` that hold ``slots [k]``: ``read_slots`` (whole view) or ``write_slots`` (local).

        Raises:
            LaneReadError: a ``local`` buffer and a slot this rank does not own.
        """
        if self.holds_every_lane:
            return self.layout.read_slots(slots)
        self._require_owned(
            slots, "read", LaneReadError, "under kv_access=local a rank holds only its own lane (C-MERGE)"
        )
        return self.layout.write_slots(slots)

    def _require_owned(self, slots: torch.Tensor, verb: str, error: type[Exception], why: str) -> None:
        """Raise ``error`` naming the first of ``slots`` (and its lane) that this rank does not own."""
        owned = self.layout.owned_mask(slots, self.rank)
        if not bool(owned.all()):
            bad = slots[~owned]
            raise error(
                f"rank {self.rank} asked to {verb} slot {int(bad[0])} of lane "
                f"{int(self.layout.lane_of(bad[:1])[0])}: {why}"
            )

    def held_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows of ``storage`` holding those of ``slots`` that this buffer holds (local: the owned ones)."""
        if self.holds_every_lane:
            return self.layout.read_slots(slots)
        return self.layout.write_slots(slots[self.layout.owned_mask(slots, self.rank)])

    def publish(self, group: RankGroup, layer: int) -> None:
        """Second half of the write fence of ``layer``: no-op for ``shm``; lane all-gather for ``mirrored``."""
        if self.kind == "mirrored":
            own = self.lane(layer).clone()
            dist.all_gather(list(self.storage[layer].split(self.layout.lane_slots)), own, group=group.pg)


def create_kv_buffer(
    group: RankGroup, layout: SharedKVLayout, num_layers: int, row_width: int, *, kind: str, tag: str
) -> KVBuffer:
    """Allocate the group's KV buffer (collective: every rank calls it, errors raise on every rank).

    Args:
        group: the CP group; ``layout.cp_size`` must equal its size.
        layout: pool geometry (C, P, Q).
        num_layers, row_width: layers and floats per KV row.
        kind: ``"shm"`` (CPU shared memory, gloo), ``"mirrored"`` (a per-rank mirror of the sharded
            view, filled by all-gather) or ``"local"`` (the own lane only, ``kv_access = local``).
        tag: unique name part of this run and buffer (the shm file is ``cpkv-kv-<tag>.bin``).

    Returns:
        A ``KVBuffer`` with every row NaN.

    Raises:
        ConfigError: unknown ``kind``, ``shm`` on a non-CPU device, a layout of another group size, or a
            buffer above ``cpkv.limits.MAX_ARRAY_BYTES`` (checked before allocating).
        OSError: the shm file cannot be created or mapped (on every rank).
    """
    check_int("num_layers", num_layers, 1)
    check_int("row_width", row_width, 1)
    if kind not in KV_BUFFERS:
        hint = (
            " ('replicated' is now 'mirrored': each rank mirrors the sharded view)"
            if kind == "replicated"
            else ""
        )
        raise ConfigError(f"kv buffer {kind!r} unknown; use one of {', '.join(KV_BUFFERS)}{hint}")
    if layout.cp_size != group.world_size:
        raise ConfigError(f"layout cp_size={layout.cp_size} but the group has {group.world_size} ranks")
    rows = layout.lane_slots if kind == "local" else layout.num_slots
    shape = (num_layers, rows, row_width)
    check_bytes(
        f"a KV buffer of {num_layers} layers x {rows:,} slots x {row_width} floats",
        4 * num_layers * rows * row_width,
        ConfigError,
        "lower --pages-per-lane",
    )
    if kind in ("mirrored", "local"):
        storage = torch.full(shape, float("nan"), dtype=torch.float32, device=group.device)
        return KVBuffer(layout, group.rank, storage, kind)
    if group.device.type != "cpu":
        raise ConfigError(
            f"kv buffer 'shm' needs CPU tensors, the group computes on {group.device}; use 'mirrored'"
        )
    path = shm_dir() / f"{FILE_PREFIX}{tag}.bin"
    numel = num_layers * layout.num_slots * row_width
    rank0 = group.rank == 0
    try:  # two agreed steps: rank 0 creates and fills the file, then the other ranks map it
        created = group.run("create the shared KV file", _create_shm if rank0 else _nothing, path, numel)
        mapped = group.run("map the shared KV file", _nothing if rank0 else _attach_shm, path, numel)
        flat = created if rank0 else mapped
        assert flat is not None  # rank 0's step created the file, the others' mapped it
    finally:
        if group.rank == 0:
            path.unlink(missing_ok=True)  # every rank has mapped it (or failed): the name is no longer needed
    return KVBuffer(layout, group.rank, flat.view(shape), kind)


def _nothing(path: Path, numel: int) -> None:
    """The other ranks' part of a step only one rank does."""


def _create_shm(path: Path, numel: int) -> torch.Tensor:
    """Create ``path`` exclusively (fails if it exists), size it, map it shared and fill it with NaN."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, numel * 4)
    finally:
        os.close(fd)
    flat = torch.from_file(str(path), shared=True, size=numel, dtype=torch.float32)
    flat.fill_(float("nan"))
    return flat


def _attach_shm(path: Path, numel: int) -> torch.Tensor:
    """Map an existing shared KV file of ``numel`` float32 (never creates one)."""
    size = path.stat().st_size  # FileNotFoundError if rank 0 did not create it
    if size != numel * 4:
        raise OSError(f"shared KV file {path} has {size} bytes, expected {numel * 4}")
    return torch.from_file(str(path), shared=True, size=numel, dtype=torch.float32)
