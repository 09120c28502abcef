"""What the ``cpkv`` commands share: the typed error of bad command-line input and the option types and
callbacks of ``plan``, ``simulate`` and ``run-dist`` (``executor/cli_entry.py``)."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import CpkvError


class InputError(CpkvError, ValueError):
    """Bad command-line input (a file, a flag combination); exits 2 with a one-line message."""


class FilePath(click.Path):
    """``click.Path`` giving a ``Path`` that refuses the empty string, which ``Path("")`` would turn into
    ``.``, the current directory (``--out ""`` would write the report there): a usage error naming the flag."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(self, value, param, ctx):
        """The path as a ``Path``; ``""`` fails (exit 2, "Invalid value for '--out': the path is empty")."""
        if value == "":
            self.fail("the path is empty; give a file or directory name", param, ctx)
        return super().convert(value, param, ctx)


def parse_pages_per_lane(ctx, param, value: str | None) -> int | tuple[int, ...] | None:
    """Click callback of ``--pages-per-lane`` (``simulate`` and ``run-dist``): ``"16384"`` -> 16384 (every
    lane), ``"9,10,10,10"`` -> (9, 10, 10, 10) (one per lane), None and ``"auto"`` give None (the default:
    what the GPU holds under the measured model, ``SimConfig.for_workload``); the count and range are the
    config's to check.

    Raises:
        click.BadParameter: a part that is not an integer (exit 2, one line).
    """
    if value is None or value == "auto":
        return None
    try:
        parts = [int(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an int or a comma-separated list of ints") from None
    return parts[0] if len(parts) == 1 else tuple(parts)
