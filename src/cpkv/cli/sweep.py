"""``cpkv sweep``: replay a workload over a grid of ``cpkv simulate`` settings, on this machine's cores or a
Ray cluster, resumably (``cpkv.sweep``; docs/sweep.md)."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from .options import FilePath


@click.command()
@click.argument("grid_file", metavar="GRID.toml", type=FilePath())
@click.option(
    "--out",
    "out_dir",
    type=FilePath(),
    default=Path("out/sweep"),
    show_default=True,
    help="Directory for points/, results.csv, results.json, summary.csv, pareto.png, hit_rate.png.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: a process pool on this machine; ray: Ray actors (the `ray` extra).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Processes (local) or Ray actors [every core; ray: the cluster's CPUs].",
)
@click.option(
    "--ray-address",
    default=None,
    help="An existing Ray cluster (ray start --head prints it; 'auto': the one on this machine) "
    "[--executor ray starts a local Ray].",
)
@click.option(
    "--max-points",
    type=click.IntRange(min=1),
    default=None,
    help="Most points the grid may make (its lists' lengths multiplied) [100,000].",
)
@click.option("--retry-failed", is_flag=True, help="Replay points whose stored result failed.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def sweep(grid_file, out_dir, executor, workers, ray_address, max_points, retry_failed, no_progress) -> None:
    """Replay one workload at every point of GRID.toml, a grid of `cpkv simulate` settings.

    Each point is one `cpkv simulate` replay (one policy) of the grid's workload, split over `groups` CP
    groups; its result is stored under OUT/points/ keyed by a hash of its whole config, so a re-run, or a
    run after Ctrl-C, replays only the points not stored. A point that fails is recorded with its error.
    Writes results.csv / results.json (a row per point), summary.csv (the fewest GPUs that meet the
    grid's target, per design), pareto.png and hit_rate.png. Ctrl-C (exit 130) or SIGTERM (exit 143)
    stops the workers, writes the results of the finished points and says so on one line.
    """
    from ..errors import InputError
    from ..sweep.grid import MAX_POINTS, read_grid
    from ..sweep.run import OUTPUT_FILES, SweepInterrupted, SweepTerminated
    from ..sweep.run import sweep as run_sweep
    from .simulate import check_out_dir

    if ray_address is not None and executor != "ray":
        raise InputError("--ray-address needs --executor ray")
    grid = read_grid(grid_file, max_points or MAX_POINTS)
    check_out_dir(out_dir, OUTPUT_FILES)
    if executor == "ray":
        from ..sweep.executors import check_ray_address, import_ray

        import_ray()  # before any work: InputError naming the extra
        check_ray_address(ray_address)  # before any output file: one line, not Ray's endless retries

    def terminated(signum, frame):  # SIGTERM stops the sweep as Ctrl-C does
        raise SweepTerminated()

    try:
        old = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: SIGTERM keeps its disposition
        old = None
    try:
        outcome = run_sweep(
            grid,
            out_dir,
            executor=executor,
            workers=workers,
            ray_address=ray_address,
            progress=not no_progress,
            retry_failed=retry_failed,
        )
    except SweepInterrupted as e:
        if e.terminated:  # one line, exit 143 (128 + SIGTERM)
            click.echo(f"cpkv: terminated: {e.line}", err=True)
            raise click.exceptions.Exit(143) from None
        raise click.exceptions.Abort(e.line) from None  # main prints it on one line, exit 130
    except SweepTerminated:  # before any point ran
        click.echo("cpkv: terminated", err=True)
        raise click.exceptions.Exit(143) from None
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    ok = sum(1 for r in outcome.rows if r["status"] == "ok")
    click.echo(
        f"{len(outcome.rows)} points: {outcome.replayed} replayed, {outcome.stored} stored earlier, "
        f"{outcome.failed} failed, in {outcome.wall_s:.1f} s; wrote {', '.join(map(str, outcome.paths))}"
    )
    if not ok:
        first = next((r["error"] for r in outcome.rows if r["error"]), "no point ran")
        raise InputError(f"no point of {grid_file} ran; the first error: {first}")
