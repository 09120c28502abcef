"""Records of the governance checker: problems, and the RFC, clause and work-item documents.

Records are built only from documents that passed their JSON schema, so every field read here exists
and has the schema's type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One finding of the checker, printed as ``path: message`` or ``path:line: message``.

    ``path`` is POSIX-style and relative to the repository root (``gov/work/W1-core.toml``); ``line`` is
    1-based and set only for findings in Python test files.
    """

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


def problem(path: str, message: str, line: int = 0) -> Problem:
    """Build a :class:`Problem`; ``line`` 0 means "no line" (a TOML or JSON file as a whole)."""
    return Problem(path, line, message)


@dataclass(frozen=True)
class Rfc:
    """``gov/rfc/RFC-NNNN/rfc.toml``: ``sections`` is ``((title, (clause ids ...)), ...)`` in order."""

    rel: str
    dir_name: str
    id: str
    title: str
    version: str
    status: str
    phase: str
    sections: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def from_doc(cls, rel: str, dir_name: str, doc: dict[str, Any]) -> Rfc:
        """Build from a schema-valid document."""
        meta = doc["govctl"]
        sections = tuple((s["title"], tuple(s["clauses"])) for s in doc["sections"])
        return cls(
            rel, dir_name, meta["id"], meta["title"], meta["version"], meta["status"], meta["phase"], sections
        )


@dataclass(frozen=True)
class Clause:
    """``gov/rfc/RFC-NNNN/clauses/C-NAME.toml``; ``rfc_dir`` is the name of the RFC's directory."""

    rel: str
    rfc_dir: str
    id: str
    title: str
    kind: str
    status: str
    since: str
    superseded_by: str | None
    tags: tuple[str, ...]

    @classmethod
    def from_doc(cls, rel: str, rfc_dir: str, doc: dict[str, Any]) -> Clause:
        """Build from a schema-valid document."""
        m = doc["govctl"]
        return cls(
            rel,
            rfc_dir,
            m["id"],
            m["title"],
            m["kind"],
            m["status"],
            m["since"],
            m.get("superseded_by"),
            tuple(m["tags"]),
        )


@dataclass(frozen=True)
class ChecklistItem:
    """One checklist entry of a work item; ``tests`` are pytest node ids relative to the root."""

    text: str
    done: bool
    tests: tuple[str, ...]


@dataclass(frozen=True)
class WorkItem:
    """``gov/work/WN-slug.toml``: a unit of work, the clauses it implements and its checklist."""

    rel: str
    id: str
    title: str
    status: str
    clauses: tuple[str, ...]
    checklist: tuple[ChecklistItem, ...]

    @classmethod
    def from_doc(cls, rel: str, doc: dict[str, Any]) -> WorkItem:
        """Build from a schema-valid document."""
        m = doc["govctl"]
        items = tuple(
            ChecklistItem(c["text"], c["done"], tuple(c["tests"])) for c in doc["content"]["checklist"]
        )
        return cls(rel, m["id"], m["title"], m["status"], tuple(m["clauses"]), items)
