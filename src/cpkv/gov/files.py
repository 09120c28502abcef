"""Finding the repository root, listing the governance files and reading them as TOML.

Layout read here (relative to the root)::

    gov/schema/{rfc,clause,work}.schema.json
    gov/rfc/RFC-NNNN/rfc.toml
    gov/rfc/RFC-NNNN/clauses/C-NAME.toml
    gov/work/WN-slug.toml

Every TOML file starts with ``#:schema <relative path to its schema>`` (the header TOML editors use).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpkv.gov.model import Problem, problem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

SCHEMA_DIR = "gov/schema"
KINDS = ("rfc", "clause", "work")


@dataclass(frozen=True)
class GovFile:
    """One governance file: ``kind`` is ``rfc``, ``clause`` or ``work``; ``rel`` is POSIX, root-relative."""

    kind: str
    path: Path
    rel: str


def rel_path(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` in POSIX form (``..`` steps when outside the root)."""
    return Path(os.path.relpath(path, root)).as_posix()


def find_root(start: Path) -> Path | None:
    """The nearest directory at or above ``start`` that contains a ``gov/`` directory, else None."""
    start = start.resolve()
    for candidate in (start, *start.parents):
        if (candidate / "gov").is_dir():
            return candidate
    return None


def schema_path(root: Path, kind: str) -> Path:
    """Path of the JSON schema of ``kind`` (``rfc``, ``clause`` or ``work``) under ``root``."""
    return root / SCHEMA_DIR / f"{kind}.schema.json"


def discover(root: Path) -> list[GovFile]:
    """All governance TOML files under ``root/gov``, RFCs first, then clauses, then work items, sorted."""
    gov = root / "gov"
    found = [("rfc", p) for p in sorted(gov.glob("rfc/*/rfc.toml"))]
    found += [("clause", p) for p in sorted(gov.glob("rfc/*/clauses/*.toml"))]
    found += [("work", p) for p in sorted(gov.glob("work/*.toml"))]
    return [GovFile(kind, p, rel_path(p, root)) for kind, p in found]


def read_gov_file(gf: GovFile, root: Path) -> tuple[dict[str, Any] | None, list[Problem]]:
    """Parse ``gf`` as TOML and check its ``#:schema`` header; the document is None when unparsable."""
    text = gf.path.read_text(encoding="utf-8")
    expected = rel_path(schema_path(root, gf.kind), gf.path.parent)
    first_line = text.split("\n", 1)[0].strip()
    problems = []
    if first_line != f"#:schema {expected}":
        problems.append(problem(gf.rel, f"first line must be '#:schema {expected}'"))
    try:
        return tomllib.loads(text), problems
    except tomllib.TOMLDecodeError as exc:
        return None, [*problems, problem(gf.rel, f"invalid TOML: {exc}")]
