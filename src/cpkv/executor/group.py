"""The CP process group: start-up self-check, error agreement, replica digests, gather-back.

Every collective the executor makes goes through ``RankGroup``, with the group, rank and size passed
explicitly (no global group lookups). Failure handling rule: after any step where one rank can fail, all
ranks ``agree`` (an ``all_reduce(MAX)`` of a status flag, then the failing rank's pickled error), so every
rank raises the same typed error and no rank is left blocked in a collective.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import pickle
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist

from .errors import RankOrderError, RemoteRankError, ReplicaDivergence

T = TypeVar("T")

DEFAULT_ADDR = "127.0.0.1"


def loopback_interface() -> str | None:
    """Name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS), or None if unknown."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n.startswith("lo")), None)


def free_port(addr: str = DEFAULT_ADDR) -> int:
    """A TCP port on ``addr`` that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def check_rank_order(gathered: list[int], world_size: int) -> None:
    """Self-check of an all-gather of rank ids: slot i must hold rank i.

    Args:
        gathered: ``[world_size]`` rank ids in all-gather output order.
        world_size: C.

    Raises:
        RankOrderError: a wrong length, or slot i holding another rank (message names both).
    """
    if len(gathered) != world_size:
        raise RankOrderError(
            f"rank self-check: all-gather returned {len(gathered)} slots for world_size={world_size}"
        )
    for i, r in enumerate(gathered):
        if int(r) != i:
            raise RankOrderError(
                f"rank self-check failed: all-gather slot {i} holds rank {int(r)}, not {i}; the rank-major "
                f"KV view and the gather-back (C-GATHER) need collectives in explicit rank order "
                f"{list(range(world_size))}, got {[int(x) for x in gathered]}"
            )


@dataclass
class RankGroup:
    """One rank's handle on the CP group.

    Attributes:
        rank: this process's rank (int in ``[0, world_size)``); also its owner lane.
        world_size: C, ranks in the group.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (every rank has a GPU).
        device: torch device for compute and collectives (``cpu`` or ``cuda:<local rank>``).
        pg: the process group (None: the default group).
        single_host: every rank runs on this host (``LOCAL_WORLD_SIZE`` equals ``world_size``, or unset);
            False for a torchrun world over several nodes, where no ``/dev/shm`` file spans the group.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    pg: dist.ProcessGroup | None = None
    single_host: bool = True

    @classmethod
    def init(
        cls,
        rank: int,
        world_size: int,
        *,
        init_method: str,
        backend: str | None = None,
        timeout_s: float = 60.0,
        local_rank: int | None = None,
    ) -> RankGroup:
        """Join the process group and run the start-up self-check.

        Args:
            rank, world_size: as for ``torch.distributed.init_process_group``.
            init_method: e.g. ``tcp://127.0.0.1:29500`` or ``env://`` (torchrun).
            backend: ``None`` picks ``nccl`` when CUDA has a device for every local rank (``LOCAL_WORLD_SIZE``,
                else ``world_size``), else ``gloo``.
            timeout_s: limit of every collective, in seconds: a peer that never arrives fails the step.
            local_rank: GPU index for nccl (default: ``rank``).

        Raises:
            RankOrderError: the self-check all-gather does not hold rank i in slot i.
        """
        local_rank = rank if local_rank is None else local_rank
        if backend is None:  # the same answer on every rank of a node: GPUs for all local ranks, or none
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
            backend = (
                "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_world else "gloo"
            )
        local_addr = DEFAULT_ADDR in init_method or os.environ.get("MASTER_ADDR") in (
            DEFAULT_ADDR,
            "localhost",
        )
        if backend == "gloo" and local_addr:
            lo = loopback_interface()
            if lo is not None:
                os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)  # gloo's own sockets on 127.0.0.1 too
        device = torch.device("cpu")
        if backend == "nccl":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        single_host = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) == world_size
        group = cls(rank=rank, world_size=world_size, backend=backend, device=device, single_host=single_host)
        group.self_check()
        return group

    def close(self) -> None:
        """Leave the process group (idempotent)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------------------------ collectives
    def self_check(self) -> None:
        """All-gather each rank's id; slot i must hold rank i (else ``RankOrderError`` on every rank)."""
        out = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(out, torch.tensor([self.rank], dtype=torch.int64, device=self.device), group=self.pg)
        check_rank_order([int(t.item()) for t in out], self.world_size)

    def agree(self, error: BaseException | None, where: str) -> None:
        """Collective status check: if any rank passes an error, every rank raises the same error.

        ``all_reduce(MAX)`` of a 0/1 flag (also the write fence: no rank returns before every rank has
        entered, i.e. finished its writes), then, only on failure, ``all_gather_object`` of the failing
        ranks' pickled errors. Every rank raises the error of the lowest failing rank, unpickled (so a
        ``LaneExhausted`` keeps its ``lane``, ``needed`` and ``available``); an error that cannot be
        pickled becomes ``RemoteRankError`` on every rank.

        Args:
            error: this rank's exception from the step, or None.
            where: name of the step, for the note added to the error.
        """
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.pg)
        if int(flag.item()) == 0:
            return
        payload = None if error is None else pickle_error(error, self.rank, where)
        payloads: list[bytes | None] = [None] * self.world_size
        dist.all_gather_object(payloads, payload, group=self.pg)
        src = next(r for r, p in enumerate(payloads) if p is not None)
        err = pickle.loads(payloads[src])  # type: ignore[arg-type]
        if hasattr(err, "add_note"):
            err.add_note(
                f"[cpkv.executor] raised on rank {src} during {where}; every rank of the group raises it"
            )
        raise err from (error if error is not None else None)

    def run(self, where: str, fn: Callable[..., T], *args, **kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on this rank, then ``agree`` with the peers; returns fn's result."""
        error, result = None, None
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every error is shipped to the peers, then re-raised
            error = e
        self.agree(error, where)
        return result  # type: ignore[return-value]

    def check_replicas(self, digest: str, where: str) -> None:
        """Raise ``ReplicaDivergence`` on every rank if ``digest`` (a string) differs between ranks.

        One all-gather of the string's SHA-256 (32 bytes per rank), not of the string itself.
        """
        sha = hashlib.sha256(digest.encode()).digest()
        mine = torch.from_numpy(np.frombuffer(sha, dtype=np.int64).copy()).to(self.device)[None, :]
        every = self.gather_rows(mine, 1).cpu().numpy()  # [C, 4]
        bad = [r for r in range(self.world_size) if not np.array_equal(every[r], every[0])]
        if bad:
            shas = [every[r].tobytes().hex()[:12] for r in range(self.world_size)]
            raise ReplicaDivergence(
                f"replicated state differs at {where}: ranks {bad} disagree with rank 0 (SHA-256 of the "
                f"digests {shas}); every rank must replay the same allocator calls and choices"
            )

    def gather_rows(self, local: torch.Tensor, max_rank_tokens: int) -> torch.Tensor:
        """All-gather each rank's rows padded to M, concatenated in rank order (SPEC C-GATHER).

        Args:
            local: ``[n_r, d]`` float32, this rank's rows in ascending flat token order, ``n_r <= M``.
            max_rank_tokens: M, the plan's ``max_rank_tokens``.

        Returns:
            ``[C * M, d]``: rank r's rows at ``r*M .. r*M + n_r - 1``; index it with ``gather_index``.
        """
        M, d = max_rank_tokens, local.shape[1]
        if M == 0:
            return local.new_zeros(0, d)
        padded = torch.zeros(M, d, dtype=local.dtype, device=self.device)
        padded[: local.shape[0]] = local
        out = torch.empty(self.world_size * M, d, dtype=local.dtype, device=self.device)
        dist.all_gather(list(out.split(M)), padded, group=self.pg)
        return out

    def exchange_rows(
        self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]
    ) -> torch.Tensor:
        """All-to-all of rows with exact sizes, no padding (``all_to_all_single``; C-MERGE's exchanges).

        Args:
            send: ``[sum(send_counts), ...]``: the rows for rank 0, then for rank 1, ... (this rank's own
                share included; it stays local).
            send_counts: ``[C]`` rows for each rank. recv_counts: ``[C]`` rows to receive from each rank.

        Returns:
            ``[sum(recv_counts), ...]``: rank 0's rows for this rank, then rank 1's, ...
        """
        out = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=self.device)
        if self.world_size == 1:
            out.copy_(send)
            return out
        dist.all_to_all_single(
            out,
            send.contiguous(),
            output_split_sizes=list(recv_counts),
            input_split_sizes=list(send_counts),
            group=self.pg,
        )
        return out

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (``all_reduce(MIN)``; collective)."""
        t = torch.tensor([int(bool(flag))], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.pg)
        return bool(t.item())

    def broadcast_object(self, obj: T, src: int = 0) -> T:
        """Rank ``src``'s ``obj`` (picklable) on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.pg)
        return box[0]

    def barrier_ok(self, where: str) -> None:
        """A barrier that is also an error check (``agree(None, where)``)."""
        self.agree(None, where)


def pickle_error(error: BaseException, rank: int, where: str) -> bytes:
    """``error`` pickled, if it survives a round trip, else a ``RemoteRankError`` naming it."""
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - unpicklable errors are replaced, not lost
        return pickle.dumps(RemoteRankError(rank, where, repr(error)))
