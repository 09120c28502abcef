"""``python -m cpkv.gov check [--root DIR] [--tests DIR] [--spec FILE] [--report]``.

Prints each problem as ``path: message`` (``path:line: message`` for test files) and exits 1, or prints
one ``OK: ...`` line and exits 0. Exit 2: usage error, or no ``gov/`` directory at or above the CWD; these
print one ``cpkv: error: ...`` line on stderr, as the ``cpkv`` command does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from cpkv.gov.check import run_check
from cpkv.gov.files import find_root
from cpkv.gov.report import report_lines


class UsageError(Exception):
    """A command-line usage error of ``python -m cpkv.gov``; ``main`` prints it and returns 2."""


class _Parser(argparse.ArgumentParser):
    """argparse without its usage banner: errors become one ``cpkv: error:`` line (via ``UsageError``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see python -m cpkv.gov --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m cpkv.gov", description="Check the governance files in gov/.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate gov/ and the clause marks of the tests")
    check.add_argument(
        "--root",
        type=Path,
        default=None,
        help="repository root (default: nearest directory at or above the CWD holding gov/)",
    )
    check.add_argument(
        "--tests", default="tests", help="test directory, relative to the root (default: tests)"
    )
    check.add_argument(
        "--spec",
        default=None,
        help="SPEC markdown, relative to the root: each clause id in it must have a clause file",
    )
    check.add_argument("--report", action="store_true", help="also print the clause -> tests table")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 OK, 1 problems found, 2 usage error or no gov/ directory)."""
    try:
        args = _parser().parse_args(argv)
    except UsageError as e:
        return _error(str(e))
    root = args.root if args.root is not None else find_root(Path.cwd())
    if root is None or not (root / "gov").is_dir():
        return _error(f"no gov/ directory in {root or 'the CWD or above'}; pass --root DIR")
    if args.spec is not None and not (root / args.spec).is_file():
        return _error(f"--spec {args.spec}: no such file (relative to the root {root})")
    result = run_check(root, args.tests, args.spec)
    if args.report:
        print("\n".join(report_lines(result)))
    for found in result.problems:
        print(found)
    print(result.summary())
    return 0 if result.ok else 1


def _error(message: str) -> int:
    print(f"cpkv: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. ``--report | head``: the reader left; not an error of the check
        sys.stderr.close()
        sys.exit(0)
