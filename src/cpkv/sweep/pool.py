"""The ``local`` executor's process pool: spawned workers, one point each at a time, each on its own pipe.

The driver hands each worker one ``PointTask`` at a time, so it knows which point every worker holds. A
worker that dies under a point (killed, out of memory) costs that point only (``status: "lost"``, not
stored: a re-run retries it); a new worker takes its place and the other points go on in the same run.
Workers leave nothing behind: each exits when its pipe closes or when the driver's process ends (a
thread waits on the parent's sentinel), even a driver killed with SIGKILL in the middle of a point. Pipes
only, no queue or lock, so the pool starts no resource tracker. Ctrl-C (and SIGTERM, which ``cpkv
sweep`` turns into the same interrupt) reaches the driver only: it stops every worker and re-raises.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from multiprocessing.connection import wait

from .point import PointTask, Shipment, run_task

OnResult = Callable[[PointTask, dict], None]


def lost(task: PointTask, why: str) -> dict:
    """The result of a point whose worker was lost (``status: "lost"``, not stored: a re-run retries it)."""
    return {
        "key": task.key,
        "status": "lost",
        "error": f"the worker was lost: {why}",
        "metrics": None,
        "per_group": None,
        "wall_s": None,
        "cpkv_version": None,
    }


def _exit_with(parent: multiprocessing.process.BaseProcess) -> None:
    """Exit this worker at once when ``parent`` (the driver) ends."""
    parent.join()
    os._exit(0)


def _serve(conn) -> None:
    """A worker: the shipment, then one task at a time until the pipe closes or a None comes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops the pool on Ctrl-C
    parent = multiprocessing.parent_process()
    if parent is not None:  # the driver gone (even by SIGKILL): exit, whatever point is running
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    try:
        shipment = conn.recv()
        if shipment is None:  # stopped before any point
            return
        workloads = shipment.unpack()
        while True:
            task = conn.recv()
            if task is None:
                return
            conn.send(run_task(task, workloads))
    except (EOFError, OSError):  # the driver closed the pipe
        return


class _Worker:
    def __init__(self, ctx) -> None:
        self.conn, there = ctx.Pipe()
        with sigint_ignored():  # the worker starts ignoring a terminal's Ctrl-C (through exec)
            self.proc = ctx.Process(target=_serve, args=(there,), daemon=True)
            self.proc.start()
        there.close()
        self.task: PointTask | None = None
        self.shipped = False

    def give(self, task: PointTask, shipment: Shipment) -> None:
        if not self.shipped:
            self.conn.send(shipment)
            self.shipped = True
        self.task = task
        self.conn.send(task)

    def stop(self, now: bool) -> None:
        if now:
            self.proc.terminate()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.conn.close()


def run_pool(tasks: Sequence[PointTask], shipment: Shipment, workers: int, on_result: OnResult) -> None:
    """Replay ``tasks`` on ``workers`` spawned processes (at most one per task); ``on_result(task, result)``
    in this process as each point finishes or is lost. Raises KeyboardInterrupt after stopping them."""
    if not tasks:
        return
    ctx = multiprocessing.get_context("spawn")  # the driver runs a progress thread: no fork
    queue = list(reversed(tasks))
    pool = [_Worker(ctx) for _ in range(max(1, min(workers, len(tasks))))]

    def give(i: int) -> None:  # the next task to worker i; one that died idle is replaced first
        task = queue.pop()
        try:
            pool[i].give(task, shipment)
        except OSError:
            pool[i].stop(now=True)
            pool[i] = _Worker(ctx)
            pool[i].give(task, shipment)

    try:
        for i in range(len(pool)):
            give(i)
        while any(w.task is not None for w in pool):
            busy = [w for w in pool if w.task is not None]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy])
            for i, w in enumerate(pool):
                if w.task is None or not (w.conn in ready or w.proc.sentinel in ready):
                    continue
                task, w.task = w.task, None
                try:
                    result = w.conn.recv() if w.conn.poll() else None
                except (EOFError, OSError):
                    result = None
                if result is None:  # died under the point: a new worker in its place, if work is left
                    w.proc.join(5)
                    code = w.proc.exitcode
                    why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                    result = lost(task, f"the process running the point ended ({why})")
                    w.stop(now=True)
                    if queue:
                        pool[i] = _Worker(ctx)
                on_result(task, result)
                if queue:
                    give(i)
    except BaseException:
        for w in pool:
            w.stop(now=True)
        for w in pool:
            w.proc.join(5)
        raise
    for w in pool:
        w.stop(now=False)
    for w in pool:
        w.proc.join(10)


@contextmanager
def sigint_ignored():
    """SIGINT ignored for the block (main thread only): processes started inside inherit the ignored
    disposition through exec, so a Ctrl-C at the terminal, sent to the whole process group, reaches only
    the driver, which stops them, instead of printing a traceback from each one still importing."""
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to do
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
