"""Start the CP group: spawn C local processes (``run_dist``) or join a torchrun world (``run_torchrun``).

``run_dist`` picks a free port on 127.0.0.1 at run time, spawns the ranks with the ``spawn`` start method,
waits for every rank's report with a deadline, then joins, terminates and kills stragglers, and removes
any shared-memory file of the run. Every rank reports either its results or its (pickled) error, so the
caller sees what each rank raised.

Ctrl-C: the ranks start with SIGINT ignored (blocked while they start, so none is lost in the parent), so
a terminal's Ctrl-C, which signals the whole foreground process group, interrupts only the parent. The
parent then kills every rank at once (no rank prints a traceback), removes the run's shared-memory files
and re-raises ``KeyboardInterrupt``.
"""

from __future__ import annotations

import os
import pickle
import queue as queue_mod
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.multiprocessing as mp

from ..config import check_int
from .case import DistCase, run_cases
from .errors import LaunchError
from .group import DEFAULT_ADDR, RankGroup, free_port, pickle_error
from .kv_buffer import FILE_PREFIX, shm_dir
from .records import CaseResult

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class RankOutcome:
    """What one rank reported: its result, or the error it raised (the same on every rank)."""

    rank: int
    result: object
    error: BaseException | None


@dataclass(frozen=True, eq=False)
class DistRun:
    """Outcomes of a spawned run, in rank order.

    Attributes:
        cp_size: ranks. outcomes: ``RankOutcome`` per rank. wall_s: seconds from spawn to the last report.
    """

    cp_size: int
    outcomes: list[RankOutcome]
    wall_s: float

    @property
    def errors(self) -> list[BaseException | None]:
        """Each rank's error (None where it succeeded), rank order."""
        return [o.error for o in self.outcomes]

    @property
    def results(self) -> list[CaseResult]:
        """Rank 0's result (for ``run_dist``: its ``CaseResult`` list, with hidden states and errors)."""
        self.raise_for_error()
        return self.outcomes[0].result  # type: ignore[return-value]

    def raise_for_error(self) -> None:
        """Raise the lowest failing rank's error, if any rank failed."""
        for o in self.outcomes:
            if o.error is not None:
                raise o.error


def make_run_tag() -> str:
    """A name part unique to this run (pid and random hex), for shared-memory file names."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def run_rank(
    rank: int,
    world_size: int,
    target: Callable[..., T],
    *args,
    init_method: str,
    backend: str | None = None,
    timeout_s: float = 60.0,
    local_rank: int | None = None,
) -> T:
    """Join the group as ``rank``, return ``target(group, *args)``, leave the group (also on error).

    Args:
        rank, world_size: this process's rank and C.
        target: a module-level function ``target(group: RankGroup, *args)``, run on every rank.
        init_method: ``tcp://127.0.0.1:<port>`` or ``env://`` (torchrun).
        backend: None (nccl when every rank has a GPU, else gloo), ``"gloo"`` or ``"nccl"``.
        timeout_s: limit of every collective, in seconds.
        local_rank: GPU index for nccl (default ``rank``).

    Raises:
        RankOrderError: the start-up self-check failed. Whatever ``target`` raised.
    """
    group = RankGroup.init(
        rank, world_size, init_method=init_method, backend=backend, timeout_s=timeout_s, local_rank=local_rank
    )
    try:
        return target(group, *args)
    finally:
        group.close()


def cases_target(group: RankGroup, cases: Sequence[DistCase], tag: str | None) -> list[CaseResult]:
    """Rank body of ``run_dist``: run ``cases``; ``tag=None`` lets rank 0 make and broadcast one."""
    if tag is None:
        tag = group.broadcast_object(make_run_tag() if group.rank == 0 else None)
    return run_cases(group, list(cases), tag)  # type: ignore[arg-type]


def run_dist(
    cases: Sequence[DistCase],
    cp_size: int,
    *,
    backend: str | None = None,
    timeout_s: float = 60.0,
    deadline_s: float | None = None,
    check: bool = True,
    threads_per_rank: int = 1,
) -> DistRun:
    """Spawn ``cp_size`` local ranks on 127.0.0.1 and run ``cases`` on them, in order, in one group.

    Args:
        cases: ``DistCase`` list.
        cp_size: C >= 1, processes to spawn.
        backend: None (default: nccl when there is a GPU per rank, else gloo), ``"gloo"`` or ``"nccl"``.
        timeout_s: limit of each collective inside the ranks, in seconds.
        deadline_s: limit for the whole run, in seconds (default ``120 + 4 * timeout_s``).
        check: raise the lowest failing rank's error (else return it in ``DistRun.outcomes``).
        threads_per_rank: torch intra-op threads of each rank (default 1: the ranks are the parallelism;
            see benchmarks/README.md).

    Returns:
        ``DistRun``; ``.results`` is rank 0's ``CaseResult`` list.

    Raises:
        LaunchError: a rank did not report by the deadline or died without reporting.
        The ranks' error, when ``check`` and any rank failed.
    """
    tag = make_run_tag()
    try:
        return spawn_ranks(
            cases_target,
            cp_size,
            list(cases),
            tag,
            backend=backend,
            timeout_s=timeout_s,
            deadline_s=deadline_s,
            check=check,
            threads_per_rank=threads_per_rank,
        )
    finally:
        for f in shm_dir().glob(f"{FILE_PREFIX}{tag}-*"):
            f.unlink(missing_ok=True)


def spawn_ranks(
    target: Callable[..., object],
    cp_size: int,
    *args,
    backend: str | None = None,
    timeout_s: float = 60.0,
    deadline_s: float | None = None,
    check: bool = True,
    threads_per_rank: int = 1,
) -> DistRun:
    """Spawn ``cp_size`` ranks on 127.0.0.1 (free port chosen now) and run ``target(group, *args)`` on each.

    ``target`` must be a module-level function (the ``spawn`` start method pickles it by name). Every
    rank reports its result or its error; after the deadline every rank still running is killed.
    ``threads_per_rank`` as for ``run_dist``.

    Raises:
        LaunchError: a rank did not report by the deadline (default ``120 + 4 * timeout_s`` seconds) or
            died without reporting; every process is stopped first.
        The lowest failing rank's error, when ``check``.
    """
    cp_size = check_int("cp_size", cp_size, 1)
    deadline_s = 120.0 + 4 * timeout_s if deadline_s is None else deadline_s
    port = free_port()
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    threads = check_int("threads_per_rank", threads_per_rank, 1)
    procs = [
        ctx.Process(
            target=_spawned_rank,
            name=f"cpkv-rank-{r}",
            args=(r, cp_size, port, backend, timeout_s, threads, reports, target, args),
        )
        for r in range(cp_size)
    ]
    t0 = time.monotonic()
    try:
        _start_ignoring_sigint(procs)
        raw = _collect(procs, reports, t0 + deadline_s)
        wall = time.monotonic() - t0
    except BaseException:  # Ctrl-C (KeyboardInterrupt) or an error of the parent itself: stop every rank now
        _kill(procs)
        raise
    finally:
        _stop(procs)
    outcomes = {}
    for r, msg in raw.items():
        kind, value = pickle.loads(msg)
        outcomes[r] = RankOutcome(
            rank=r,
            result=value if kind == "ok" else None,
            error=pickle.loads(value) if kind == "error" else None,
        )
    missing = [r for r in range(cp_size) if r not in raw]
    if missing:
        codes = {r: procs[r].exitcode for r in missing}
        others = "; ".join(
            f"rank {r}: {o.error!r}" if o.error else f"rank {r}: ok" for r, o in sorted(outcomes.items())
        )
        if all(code is not None for code in codes.values()):  # every one of them ended: died, not late
            why = (
                f"ranks {missing} died without reporting (exit codes {codes}); every rank was stopped. "
                "A rank that dies at start: the ranks are spawned and import the calling script again, so "
                'a script calls run_dist under `if __name__ == "__main__":`'
            )
        else:
            why = (
                f"ranks {missing} missed the {deadline_s:.0f} s deadline without reporting (exit codes "
                f"{codes}; None = was still running); every rank was stopped"
            )
        raise LaunchError(f"{why}. Reports: {others or 'none'}")
    run = DistRun(cp_size=cp_size, outcomes=[outcomes[r] for r in range(cp_size)], wall_s=wall)
    if check:
        run.raise_for_error()
    return run


def _start_ignoring_sigint(procs) -> None:
    """Start ``procs`` with SIGINT ignored in them; the parent keeps its own handler.

    A child inherits an ignored SIGINT across exec, and Python then leaves it ignored, so no rank turns a
    Ctrl-C into a ``KeyboardInterrupt`` (not even inside ``import torch``). SIGINT is also blocked in the
    parent while the children start: a Ctrl-C in that window stays pending and reaches the parent's own
    handler once it is restored. Outside the main thread (no signal handling there) the ranks just start.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        for p in procs:
            p.start()
        return
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for p in procs:
                p.start()
        finally:
            signal.signal(signal.SIGINT, old_handler)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _kill(procs) -> None:
    """SIGKILL every started rank that is still alive (all first, then reap), so none outlives the parent."""
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.exitcode is None:
            p.kill()
    for p in started:
        p.join(timeout=5.0)


def _spawned_rank(rank, world_size, port, backend, timeout_s, threads, reports, target, args) -> None:
    """Body of a spawned rank: run, then report ``(rank, pickled ("ok", result) | ("error", bytes))``."""
    torch.set_num_threads(threads)
    try:
        result = run_rank(
            rank,
            world_size,
            target,
            *args,
            init_method=f"tcp://{DEFAULT_ADDR}:{port}",
            backend=backend,
            timeout_s=timeout_s,
        )
        msg = pickle.dumps(("ok", result))
    except Exception as e:  # noqa: BLE001 - the error travels to the parent, typed
        msg = pickle.dumps(("error", pickle_error(e, rank, "run")))
    reports.put((rank, msg))


def _collect(procs, reports, deadline: float, grace_s: float = 3.0) -> dict[int, bytes]:
    """Reports by rank until all ranks reported, the deadline passed, or every silent rank is dead."""
    raw: dict[int, bytes] = {}
    dead_since: float | None = None
    while len(raw) < len(procs) and time.monotonic() < deadline:
        try:
            rank, msg = reports.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            raw[rank] = msg
            continue
        except queue_mod.Empty:
            pass
        silent = [r for r in range(len(procs)) if r not in raw]
        if all(procs[r].exitcode is not None for r in silent):  # nothing left to report
            dead_since = dead_since or time.monotonic()
            if time.monotonic() - dead_since > grace_s:
                break
    return raw


def _stop(procs, join_s: float = 10.0) -> None:
    """Join every process, then terminate and finally kill any that is still alive."""
    end = time.monotonic() + join_s
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)
