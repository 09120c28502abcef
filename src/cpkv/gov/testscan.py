"""Reading pytest test files by AST parse: which tests exist and which clauses they name.

Nothing is imported or run. A test is a module-level ``def test*`` (or ``async def``) or a ``test*``
method of a ``Test*`` class (nested classes too), as pytest collects them by default. Its node id is
``<root-relative path>::[Class::]name``. A test names clause ``C-X`` through
``@pytest.mark.clause("C-X")`` on the function or an enclosing class, a class-body ``pytestmark``, or a
module-level ``pytestmark = pytest.mark.clause(...)`` / ``pytestmark = [..., pytest.mark.clause(...)]``.
``mark.clause(...)`` after ``from pytest import mark`` is recognised too; marks inside
``pytest.param(marks=...)`` are not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from cpkv.gov.files import rel_path
from cpkv.gov.model import Problem, problem


@dataclass(frozen=True)
class ClauseMark:
    """One clause id named by one ``clause`` mark call at ``line`` of file ``rel``."""

    rel: str
    line: int
    clause: str


@dataclass
class ScannedFile:
    """A parsed test file: ``tests`` maps node id -> clause marks that apply to that test."""

    rel: str
    tests: dict[str, tuple[ClauseMark, ...]] = field(default_factory=dict)
    marks: list[ClauseMark] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def _is_clause_mark(node: ast.expr) -> TypeGuard[ast.Call]:
    """True for ``pytest.mark.clause(...)``, ``<x>.mark.clause(...)`` and ``mark.clause(...)`` calls."""
    if not (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "clause"
    ):
        return False
    owner = node.func.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "mark") or (
        isinstance(owner, ast.Name) and owner.id == "mark"
    )


class _Scanner:
    """Walks one module's AST, collecting tests and the clause marks in scope of each."""

    def __init__(self, out: ScannedFile) -> None:
        self.out = out

    def marks_of(self, exprs: list[ast.expr]) -> tuple[ClauseMark, ...]:
        found: list[ClauseMark] = []
        for expr in exprs:
            items = expr.elts if isinstance(expr, (ast.List, ast.Tuple)) else [expr]
            for node in filter(_is_clause_mark, items):
                args = node.args
                if (
                    not args
                    or node.keywords
                    or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args)
                ):
                    self.out.problems.append(
                        problem(
                            self.out.rel, "clause mark must name clause ids as string literals", node.lineno
                        )
                    )
                    continue
                found += [
                    ClauseMark(self.out.rel, node.lineno, a.value)
                    for a in args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)  # all of them (checked above)
                ]
        self.out.marks += found
        return tuple(found)

    def pytestmark(self, body: list[ast.stmt]) -> tuple[ClauseMark, ...]:
        values = [
            s.value
            for s in body
            if isinstance(s, ast.Assign)
            and s.value is not None
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
        ]
        values += [
            s.value
            for s in body
            if isinstance(s, ast.AnnAssign)
            and s.value is not None
            and isinstance(s.target, ast.Name)
            and s.target.id == "pytestmark"
        ]
        return self.marks_of(values)

    def body(self, stmts: list[ast.stmt], prefix: str, inherited: tuple[ClauseMark, ...]) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name.startswith("test"):
                own = self.marks_of(stmt.decorator_list)
                self.out.tests[f"{prefix}::{stmt.name}"] = inherited + own
            elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
                scope = inherited + self.marks_of(stmt.decorator_list) + self.pytestmark(stmt.body)
                self.body(stmt.body, f"{prefix}::{stmt.name}", scope)


def scan_file(path: Path, root: Path) -> ScannedFile:
    """Parse one test file; a syntax error is reported as a problem and yields no tests."""
    out = ScannedFile(rel_path(path, root))
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        out.problems.append(problem(out.rel, f"cannot parse: {exc.msg}", exc.lineno or 0))
        return out
    scanner = _Scanner(out)
    scanner.body(tree.body, out.rel, scanner.pytestmark(tree.body))
    return out


def find_test_files(tests_dir: Path) -> list[Path]:
    """``test_*.py`` and ``*_test.py`` files under ``tests_dir``, sorted; empty when it does not exist."""
    if not tests_dir.is_dir():
        return []
    found = {*tests_dir.rglob("test_*.py"), *tests_dir.rglob("*_test.py")}
    return sorted(p for p in found if "__pycache__" not in p.parts)


class TestIndex:
    """Scanned test files: ``in_tree`` are those under the tests directory (their marks count as clause
    links); ``files`` maps root-relative path -> file, and grows when :meth:`resolve` reads a file elsewhere.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, root: Path, tests_dir: Path) -> None:
        self.root = root
        self.in_tree = [scan_file(p, root) for p in find_test_files(tests_dir)]
        self.files = {f.rel: f for f in self.in_tree}

    def file(self, rel: str) -> ScannedFile | None:
        """The scanned file at root-relative ``rel``, or None when no such file exists."""
        if rel not in self.files:
            path = self.root / rel
            if not path.is_file():
                return None
            self.files[rel] = scan_file(path, self.root)
        return self.files[rel]

    def resolve(self, node_id: str) -> str | None:
        """None when ``node_id`` names an existing test, else why not (``no such file`` or
        ``no such test in the file``).

        A trailing parametrisation ``[...]`` is ignored: ``t.py::test_x[1-2]`` resolves like ``t.py::test_x``.
        """
        base = node_id.split("[", 1)[0]
        scanned = self.file(base.split("::", 1)[0])
        if scanned is None:
            return "no such file"
        return None if base in scanned.tests else "no such test in the file"
