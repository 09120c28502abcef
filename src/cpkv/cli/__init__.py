"""The ``cpkv`` command line: ``plan`` (owner plans, ``plan.py``), ``simulate`` (trace replay,
``simulate.py``), ``sweep`` (a grid of simulate settings, ``sweep.py``), ``run-dist`` (the executor's,
``executor/cli_entry.py``, loaded on first use); the options they share are in ``options.py``. ``main``
is the console entry point."""

from __future__ import annotations

import importlib
import sys

import click

from ..errors import CpkvError
from . import plan, simulate, sweep

__all__ = ["app", "main"]


class _LazyGroup(click.Group):
    """A command group whose heavy commands load on first use: ``run-dist`` pulls in torch and the
    executor, so ``cpkv plan`` and ``cpkv simulate`` start without them. ``lazy`` maps a command name to
    ``(module, attribute)``; the command is defined once, there (``cpkv.executor`` reuses it)."""

    lazy = {"run-dist": ("cpkv.executor.cli_entry", "run_dist_cli")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, attr = self.lazy[name]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(
    cls=_LazyGroup, help="cpkv: context-parallel prefill with an owner-lane sharded, paged KV cache."
)
@click.version_option(package_name="cpkv")
def app() -> None:
    """The ``cpkv`` command group."""


app.add_command(plan.plan)
app.add_command(simulate.simulate)
app.add_command(sweep.sweep)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: bad input prints one line to stderr and exits 2; Ctrl-C (at any moment, torch's
    import included) prints ``cpkv: aborted`` (``simulate`` adds what it saved on the same line) and exits 130.

    The context is made and invoked here rather than through click's ``main``, whose Ctrl-C handling
    prints an empty line before any message of ours.
    """
    try:
        with app.make_context("cpkv", list(sys.argv[1:] if argv is None else argv)) as ctx:
            rv = app.invoke(ctx)
    except click.exceptions.Exit as e:  # --help, --version
        return e.exit_code
    except click.exceptions.UsageError as e:
        print(f"cpkv: error: {e.format_message()}", file=sys.stderr)
        return 2
    except CpkvError as e:
        print(f"cpkv: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"cpkv: error: the input is too large to plan in this machine's memory ({e})", file=sys.stderr)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt) as e:
        said = str(e) if isinstance(e, click.exceptions.Abort) else ""  # what a command saved, if it says
        print(f"cpkv: aborted: {said}" if said else "cpkv: aborted", file=sys.stderr)
        return 130
    return rv if isinstance(rv, int) else 0
