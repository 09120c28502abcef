"""Where a sweep's points run: ``local`` (a process pool over this machine's cores, the standard library)
or ``ray`` (Ray actors on a local Ray or an existing cluster; the optional ``ray`` extra).

Either way the ``Shipment`` (the workloads and the driver's measured price tables) travels to each worker
once (the pool's initializer: once per process; Ray: one object in the object store that every actor
reads once), then only ``PointTask`` records go out and result dicts (``point.run_task``) come back;
``on_result(task, result)`` runs in the driver as each arrives. A worker lost under a point (killed, out
of memory, a node gone) gives that point ``status: "lost"``, which is not stored, so a re-run retries it;
the other points go on in the same run (a new worker takes its place). Ctrl-C stops every worker and
raises KeyboardInterrupt.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from ..errors import InputError
from .point import PointTask, Shipment, one_line, run_task
from .pool import lost, run_pool

EXECUTORS = ("local", "ray")

OnResult = Callable[[PointTask, dict], None]

RAY_OBJECT_STORE_BYTES = 256 * 2**20
"""Object store of a Ray that the sweep starts itself (Ray's default is 30 % of the machine's memory):
it holds the shipment once (the full Mooncake trace is about 4 MB pickled, the measured tables 50 kB)."""


# ----------------------------------------------------------------------------------------------- local
def run_local(
    tasks: Sequence[PointTask], shipment: Shipment, workers: int | None, on_result: OnResult
) -> None:
    """Replay ``tasks`` on ``workers`` spawned processes (default ``cpu_count()``, at most one per task):
    ``pool.run_pool``. A worker lost under a point costs that point only. Raises KeyboardInterrupt after
    stopping the workers."""
    run_pool(tasks, shipment, workers or cpu_count(), on_result)


def cpu_count() -> int:
    """The cores this process may run on (its affinity), else ``os.cpu_count()``."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
        raise InputError(
            "--executor ray needs Ray: pip install '.[ray]' in a cpkv checkout (or use --executor local)"
        ) from None
    return ray


RAY_CONNECT_TIMEOUT_S = 10.0
"""How long ``check_ray_address`` waits for a Ray cluster's head to accept a connection, in seconds."""


def check_ray_address(address: str | None, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """InputError (one line) unless ``address`` is None (a local Ray) or a Ray head answers there: ``auto``
    must find a cluster on this machine, ``[ray://]HOST:PORT`` must accept a TCP connection within
    ``timeout_s``. Run before any output file exists (``ray.init`` itself retries an address that does not
    answer for minutes)."""
    import socket

    if address is None:
        return
    if address == "auto":
        ray = import_ray()
        try:
            from ray._private.services import canonicalize_bootstrap_address

            found = canonicalize_bootstrap_address("auto")
        except ConnectionError:
            found = None
        except Exception:  # Ray's private helper moved: let ray.init answer (run_ray names its error)
            return
        if not found:
            raise InputError(
                f"--ray-address auto: no Ray cluster runs on this machine (Ray {ray.__version__}); start one "
                "with `ray start --head`, or leave out --ray-address for a local Ray"
            )
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--ray-address {address!r} is not HOST:PORT (or auto)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e) or type(e).__name__)
        raise InputError(
            f"--ray-address {address}: no Ray head answers at {host}:{port} within {timeout_s:g} s ({why}); "
            "start it with `ray start --head --port PORT`, or leave out --ray-address for a local Ray"
        ) from None


def run_ray(
    tasks: Sequence[PointTask],
    shipment: Shipment,
    workers: int | None,
    address: str | None,
    on_result: OnResult,
) -> None:
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
        local = (
            {}
            if address
            else {"num_cpus": workers or cpu_count(), "object_store_memory": RAY_OBJECT_STORE_BYTES}
        )
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
                configure_logging=True,
                **local,
            )
        except ConnectionError as e:  # e.g. the cluster went away since check_ray_address
            raise InputError(f"--ray-address {address}: {one_line(e)}") from None
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
                result = lost(task, one_line(e))
                ray.kill(actor)
                actors[actors.index(actor)] = actor = actor_class.remote(ref)
            on_result(task, result)
            submit(actor)
    finally:
        for actor in actors:
            ray.kill(actor)
        if started:
            ray.shutdown()
