"""What the ``cpkv`` commands share: the option type of a path flag and the click callback of a setting's
parse (``sim.settings.Setting.parse``). ``InputError``, the typed error of bad command-line input, lives in
``cpkv.errors`` and is named here too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from ..errors import InputError
from ..validate import EMPTY_PATH

__all__ = ["FilePath", "InputError", "parse_callback"]


class FilePath(click.Path):
    """``click.Path`` giving a ``Path`` that refuses the empty string, which ``Path("")`` would turn into
    ``.``, the current directory (``--out ""`` would write the report there): a usage error naming the flag."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(self, value, param, ctx):
        """The path as a ``Path``; ``""`` fails (exit 2, "Invalid value for '--out': the path is empty")."""
        if value == "":
            self.fail(EMPTY_PATH, param, ctx)
        return super().convert(value, param, ctx)


def parse_callback(parse: Callable[[str | None], object]) -> Callable:
    """The click callback that runs ``parse`` (e.g. ``validate.parse_pages_per_lane``) on an option's text:
    ``--pages-per-lane 9,10,10,10`` -> (9, 10, 10, 10); an InputError of ``parse`` is a usage error (exit 2,
    one line: "Invalid value for '--pages-per-lane': 'x' is not an int or a comma-separated list of ints")."""

    def callback(ctx, param, value):
        try:
            return parse(value)
        except InputError as e:
            raise click.BadParameter(str(e)) from None

    return callback
