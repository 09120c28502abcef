"""Cross-file rules: unique ids, resolving references, impossible states and clause-to-test links.

Every rule takes records that passed their schema and returns a list of :class:`Problem`. The RFC
status/phase table (``ALLOWED_PHASES``) is documented in ``docs/governance.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from cpkv.gov.model import Clause, Problem, Rfc, WorkItem, problem
from cpkv.gov.testscan import TestIndex

# RFC status -> phases it may be in. A draft or proposed text is still being specified; an accepted one
# may be implemented and tested, but only a final one can be stable; a final text is past the spec phase.
ALLOWED_PHASES: dict[str, tuple[str, ...]] = {
    "draft": ("spec",),
    "proposed": ("spec",),
    "accepted": ("spec", "impl", "test"),
    "final": ("impl", "test", "stable"),
    "deprecated": ("spec", "impl", "test", "stable"),
}


def _version(text: str) -> tuple[int, int, int]:
    """``"1.2.3-rc1"`` -> ``(1, 2, 3)`` (the schema guarantees the three numbers; pre-release is ignored)."""
    major, minor, patch = text.split("-", 1)[0].split("+", 1)[0].split(".")
    return int(major), int(minor), int(patch)


def duplicate_ids(records: Iterable[Rfc | Clause | WorkItem]) -> list[Problem]:
    """Each id defined a second time is reported at the later file, naming the first."""
    first: dict[str, str] = {}
    out = []
    for rec in records:
        if rec.id in first:
            out.append(problem(rec.rel, f"duplicate id {rec.id!r}, first defined in {first[rec.id]}"))
        else:
            first[rec.id] = rec.rel
    return out


def file_names(rfcs: Iterable[Rfc], clauses: Iterable[Clause], work: Iterable[WorkItem]) -> list[Problem]:
    """RFC directory, clause file and work-item file names must agree with the ids they hold."""
    out = [
        problem(r.rel, f"id {r.id!r} does not match the directory name {r.dir_name!r}")
        for r in rfcs
        if r.id != r.dir_name
    ]
    out += [
        problem(c.rel, f"id {c.id!r} does not match the file name; name the file {c.id}.toml")
        for c in clauses
        if PurePosixPath(c.rel).stem != c.id
    ]
    for w in work:
        stem = PurePosixPath(w.rel).stem
        if stem != w.id and not stem.startswith(f"{w.id}-"):
            out.append(
                problem(
                    w.rel,
                    f"id {w.id!r} does not match the file name; name the file "
                    f"{w.id}.toml or {w.id}-<slug>.toml",
                )
            )
    return out


def rfc_state(rfc: Rfc) -> list[Problem]:
    """An RFC's phase must be one its status allows (``ALLOWED_PHASES``)."""
    allowed = ALLOWED_PHASES[rfc.status]
    if rfc.phase in allowed:
        return []
    return [
        problem(
            rfc.rel,
            f"status {rfc.status!r} does not allow phase {rfc.phase!r} (allowed: {', '.join(allowed)})",
        )
    ]


def rfc_sections(rfc: Rfc, clauses: Sequence[Clause], file_ids: set[str]) -> list[Problem]:
    """The RFC's sections list each of its clause files exactly once and nothing else.

    ``clauses`` are the valid clauses in the RFC's ``clauses/`` directory, ``file_ids`` the stems of all
    clause files there (so a clause that failed its schema is not reported a second time as unknown).
    A clause's ``since`` may not be newer than the RFC's ``version``.
    """
    listed: dict[str, str] = {}  # clause id -> the section title that lists it
    out = []
    for title, ids in rfc.sections:
        for cid in ids:
            if cid in listed:
                out.append(
                    problem(rfc.rel, f"clause {cid!r} is listed in sections {listed[cid]!r} and {title!r}")
                )
                continue
            listed[cid] = title
            if cid not in file_ids:
                out.append(problem(rfc.rel, f"section {title!r} lists unknown clause {cid!r}"))
    for c in clauses:
        if c.id not in listed:
            out.append(problem(c.rel, f"clause {c.id!r} is not listed in any section of {rfc.rel}"))
        if _version(c.since) > _version(rfc.version):
            out.append(problem(c.rel, f"since {c.since} is newer than {rfc.id} version {rfc.version}"))
    return out


def clause_states(clauses: Sequence[Clause]) -> list[Problem]:
    """``superseded`` iff ``superseded_by`` is set, and ``superseded_by`` names an active clause."""
    by_id = {c.id: c for c in clauses}
    out = []
    for c in clauses:
        target = c.superseded_by
        if c.status == "superseded" and target is None:
            out.append(problem(c.rel, "status is 'superseded' but superseded_by is not set"))
        if target is None:
            continue
        if c.status != "superseded":
            out.append(problem(c.rel, f"superseded_by is set but status is {c.status!r}, not 'superseded'"))
        if target not in by_id:
            out.append(problem(c.rel, f"superseded_by names unknown clause {target!r}"))
        elif by_id[target].status != "active":
            out.append(
                problem(c.rel, f"superseded_by names {target!r}, which is {by_id[target].status}, not active")
            )
    return out


def work_item(w: WorkItem, clause_ids: set[str], tests: TestIndex) -> list[Problem]:
    """A work item's clauses exist; a done item has every entry checked; checked entries name a test;
    every named test id resolves to a test function (by AST parse of its file)."""
    out = [
        problem(w.rel, f"clauses lists unknown clause {cid!r}") for cid in w.clauses if cid not in clause_ids
    ]
    for i, item in enumerate(w.checklist):
        if w.status == "done" and not item.done:
            out.append(problem(w.rel, f"status is 'done' but checklist[{i}] is not checked"))
        if item.done and not item.tests:
            out.append(problem(w.rel, f"checklist[{i}] is checked but names no test"))
        for node_id in item.tests:
            reason = tests.resolve(node_id)
            if reason is not None:
                out.append(problem(w.rel, f"checklist[{i}] names unknown test {node_id!r} ({reason})"))
    return out


def clause_links(clauses: Sequence[Clause], tests: TestIndex) -> tuple[dict[str, list[str]], list[Problem]]:
    """Clause id -> node ids of the tests naming it, and the problems: every active normative clause is
    named by some test, and every clause mark names a known clause (reported once per mark)."""
    links: dict[str, list[str]] = {c.id: [] for c in clauses}
    out = []
    for scanned in tests.in_tree:
        out += scanned.problems
        out += [
            problem(m.rel, f"clause mark names unknown clause {m.clause!r}", m.line)
            for m in scanned.marks
            if m.clause not in links
        ]
        for node_id, marks in scanned.tests.items():
            for cid in dict.fromkeys(m.clause for m in marks):
                if cid in links:
                    links[cid].append(node_id)
    out += [
        problem(c.rel, f"active normative clause {c.id!r} is not named by any test")
        for c in clauses
        if c.kind == "normative" and c.status == "active" and not links[c.id]
    ]
    return links, out


# A clause id as the SPEC writes it: ``C-`` then upper-case words joined by ``-`` (``2C-1-s`` is no id).
SPEC_CLAUSE_ID = re.compile(r"\b(C-[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*)\b")


def spec_coverage(spec_text: str, spec_rel: str, clause_ids: set[str]) -> list[Problem]:
    """Every clause id written in the SPEC markdown has a clause file (reported at the SPEC path)."""
    ids = dict.fromkeys(SPEC_CLAUSE_ID.findall(spec_text))
    return [
        problem(spec_rel, f"clause {cid!r} of the spec has no clause file under gov/rfc/")
        for cid in ids
        if cid not in clause_ids
    ]
