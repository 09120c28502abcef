"""Running every check over one repository root: schemas, records, rules, test links, optional SPEC."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cpkv.gov import rules
from cpkv.gov.files import discover, read_gov_file, rel_path
from cpkv.gov.model import Clause, Problem, Rfc, WorkItem, problem
from cpkv.gov.schemas import load_validators, schema_problems
from cpkv.gov.testscan import TestIndex


@dataclass(frozen=True)
class CheckResult:
    """Outcome of :func:`run_check`.

    ``problems`` are grouped by file and line; ``rfcs``, ``clauses`` and ``work`` are the records that
    passed their schemas; ``links`` maps every clause id to the node ids of the tests that name it.
    """

    problems: tuple[Problem, ...]
    rfcs: tuple[Rfc, ...] = ()
    clauses: tuple[Clause, ...] = ()
    work: tuple[WorkItem, ...] = ()
    links: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def summary(self) -> str:
        """One line: ``OK: ...`` or ``FAILED: N problem(s); ...`` with the record and test counts."""
        normative = sum(c.kind == "normative" for c in self.clauses)
        tests = len({t for ts in self.links.values() for t in ts})
        counts = (
            f"{len(self.rfcs)} RFC(s), {len(self.clauses)} clauses ({normative} normative), "
            f"{len(self.work)} work items, {tests} clause-linked tests"
        )
        return f"OK: {counts}" if self.ok else f"FAILED: {len(self.problems)} problem(s); {counts}"


def _ordered(problems: list[Problem]) -> tuple[Problem, ...]:
    """Problems grouped by file and line, each file's in the order found; exact repeats dropped."""
    return tuple(sorted(dict.fromkeys(problems), key=lambda p: (p.path, p.line)))


def _load(root: Path, validators: dict) -> tuple[list[Rfc], list[Clause], list[WorkItem], list[Problem]]:
    """Parse and schema-check every governance file; only valid documents become records."""
    rfcs, clauses, work, problems = [], [], [], []
    for gf in discover(root):
        doc, found = read_gov_file(gf, root)
        problems += found
        if doc is None:
            continue
        found = schema_problems(validators[gf.kind], doc, gf.rel)
        problems += found
        if found:
            continue
        if gf.kind == "rfc":
            rfcs.append(Rfc.from_doc(gf.rel, gf.path.parent.name, doc))
        elif gf.kind == "clause":
            clauses.append(Clause.from_doc(gf.rel, gf.path.parent.parent.name, doc))
        else:
            work.append(WorkItem.from_doc(gf.rel, doc))
    return rfcs, clauses, work, problems


def _rfc_problems(root: Path, rfcs: list[Rfc], clauses: list[Clause]) -> list[Problem]:
    """Per RFC directory: an ``rfc.toml`` exists, its state is possible, its sections match its clauses."""
    out = []
    dirs = sorted(p for p in (root / "gov" / "rfc").glob("*") if p.is_dir())
    if not dirs:
        out.append(problem("gov/rfc", "no RFC directory found"))
    out += [problem(rel_path(d, root), "rfc.toml is missing") for d in dirs if not (d / "rfc.toml").is_file()]
    for rfc in rfcs:
        own = [c for c in clauses if c.rfc_dir == rfc.dir_name]
        stems = {p.stem for p in (root / "gov" / "rfc" / rfc.dir_name / "clauses").glob("*.toml")}
        out += rules.rfc_state(rfc) + rules.rfc_sections(rfc, own, stems)
    return out


def run_check(
    root: Path | str, tests_dir: Path | str = "tests", spec: Path | str | None = None
) -> CheckResult:
    """Check the governance files under ``root/gov`` and the clause marks of the tests in ``tests_dir``.

    ``tests_dir`` and ``spec`` (a SPEC markdown whose clause ids must all have clause files) are taken
    relative to ``root`` unless absolute. Never raises for bad content: every finding is a Problem.
    """
    root = Path(root)
    validators, problems = load_validators(root)
    if problems:
        return CheckResult(_ordered(problems))
    rfcs, clauses, work, problems = _load(root, validators)
    problems += rules.duplicate_ids([*rfcs, *clauses, *work])
    problems += rules.file_names(rfcs, clauses, work)
    problems += _rfc_problems(root, rfcs, clauses)
    problems += rules.clause_states(clauses)
    tests_path = root / tests_dir
    if not tests_path.is_dir():
        problems.append(problem(rel_path(tests_path, root), "tests directory does not exist"))
    tests = TestIndex(root, tests_path)
    clause_ids = {c.id for c in clauses}
    for w in work:
        problems += rules.work_item(w, clause_ids, tests)
    links, found = rules.clause_links(clauses, tests)
    problems += found
    if spec is not None:
        spec_path = root / spec
        spec_rel = rel_path(spec_path, root)
        if spec_path.is_file():
            problems += rules.spec_coverage(spec_path.read_text(encoding="utf-8"), spec_rel, clause_ids)
        else:
            problems.append(problem(spec_rel, "spec file does not exist"))
    return CheckResult(_ordered(problems), tuple(rfcs), tuple(clauses), tuple(work), links)
