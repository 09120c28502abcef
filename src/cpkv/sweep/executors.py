"""Where a sweep's points run: ``local`` (a process pool over this machine's cores, the standard library)
or ``ray`` (Ray actors on a local Ray or an existing cluster; the optional ``ray`` extra).

Either way the ``Shipment`` (the workloads and the driver's measured price tables) travels to each worker
once (the pool's initializer: once per process; Ray: one object in the object store that every actor
reads once), then only ``PointTask`` records go out and result dicts (``point.run_task``) come back;
``on_result(task, result)`` runs in the driver as each arrives. A worker lost under a point (killed, out
of memory, a node gone) gives that point ``status: "lost"``, which is not stored, so a re-run retries it.
Ctrl-C stops every worker and raises KeyboardInterrupt.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from contextlib import contextmanager

from ..cli.options import InputError
from .point import PointTask, Shipment, one_line, run_task

EXECUTORS = ("local", "ray")

OnResult = Callable[[PointTask, dict], None]

RAY_OBJECT_STORE_BYTES = 256 * 2**20
"""Object store of a Ray that the sweep starts itself (Ray's default is 30 % of the machine's memory):
it holds the shipment once (the full Mooncake trace is about 4 MB pickled, the measured tables 50 kB)."""

_WORKLOADS: dict = {}  # a pool worker's workloads, set once by its initializer


def lost(task: PointTask, e: BaseException) -> dict:
    """The result of a point whose worker was lost (``status: "lost"``, not stored: a re-run retries it)."""
    return {"key": task.key, "status": "lost", "error": f"the worker was lost: {one_line(e)}", "metrics": None,
            "per_group": None, "wall_s": None, "cpkv_version": None}  # fmt: skip


# ----------------------------------------------------------------------------------------------- local
def _init_worker(shipment: Shipment) -> None:
    """Pool initializer: unpack the shipment; leave Ctrl-C to the driver, which stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKLOADS.update(shipment.unpack())


def _run(task: PointTask) -> dict:
    return run_task(task, _WORKLOADS)


def run_local(tasks: Sequence[PointTask], shipment: Shipment, workers: int | None, on_result: OnResult) -> None:
    """Replay ``tasks`` on ``workers`` spawned processes (default ``cpu_count()``, at most one per task).

    ``spawn`` (not ``fork``): the driver runs a progress thread, and a forked child of a threaded process
    may inherit a held lock. Raises KeyboardInterrupt after stopping the workers.
    """
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    if not tasks:
        return
    ctx = multiprocessing.get_context("spawn")
    before = {p.pid for p in multiprocessing.active_children()}
    pool = ProcessPoolExecutor(max_workers=max(1, min(workers or cpu_count(), len(tasks))), mp_context=ctx,
                               initializer=_init_worker, initargs=(shipment,))  # fmt: skip
    try:
        with _sigint_ignored():  # the workers start (at the first submit) ignoring a terminal's Ctrl-C
            futures = {pool.submit(_run, t): t for t in tasks}
        for future in as_completed(futures):
            task = futures[future]
            try:
                result = future.result()
            except BrokenProcessPool as e:
                result = lost(task, e)
            on_result(task, result)
    except BaseException:
        for p in multiprocessing.active_children():
            if p.pid not in before:
                p.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def cpu_count() -> int:
    """The cores this process may run on (its affinity), else ``os.cpu_count()``."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def _sigint_ignored():
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


# ------------------------------------------------------------------------------------------------- ray
class PointWorker:
    """A Ray actor that unpacks the shipment (read once from the object store) and replays points."""

    def __init__(self, shipment: Shipment) -> None:
        self.workloads = shipment.unpack()

    def run(self, task: PointTask) -> dict:
        """``point.run_task`` of ``task``."""
        return run_task(task, self.workloads)


def import_ray():
    """The ``ray`` module, or InputError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install 'cpkv[ray]' (or use --executor local)") from None
    return ray


def run_ray(tasks: Sequence[PointTask], shipment: Shipment, workers: int | None, address: str | None,
            on_result: OnResult) -> None:  # fmt: skip
    """Replay ``tasks`` on Ray actors, one CPU each: ``workers`` of them (default: the cluster's CPUs, at
    most one per task). ``address``: an existing cluster (``ray start --head`` prints it; ``auto`` finds
    one on this machine); None starts a local Ray of ``workers`` (default ``cpu_count()``) CPUs, shut
    down at the end. The cluster's nodes need this cpkv installed (the results name each worker's
    version). Raises KeyboardInterrupt after stopping the actors.
    """
    if not tasks:
        return
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        local = {} if address else {"num_cpus": workers or cpu_count(),
                                    "object_store_memory": RAY_OBJECT_STORE_BYTES}  # fmt: skip
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=True, **local)  # fmt: skip
    actors: list = []
    try:
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        ref = ray.put(shipment)
        actor_class = ray.remote(num_cpus=1)(PointWorker)
        actors = [actor_class.remote(ref) for _ in range(min(n, len(tasks)))]
        queue = list(reversed(tasks))
        running: dict = {}

        def submit(actor) -> None:
            if queue:
                task = queue.pop()
                running[actor.run.remote(task)] = (actor, task)

        for actor in actors:
            submit(actor)
        while running:
            (done,), _ = ray.wait(list(running), num_returns=1)
            actor, task = running.pop(done)
            try:
                result = ray.get(done)
            except ray.exceptions.RayError as e:  # the actor died: a new one takes its place
                result = lost(task, e)
                ray.kill(actor)
                actors[actors.index(actor)] = actor = actor_class.remote(ref)
            on_result(task, result)
            submit(actor)
    finally:
        for actor in actors:
            ray.kill(actor)
        if started:
            ray.shutdown()
