"""The ``--report`` table: every clause, in RFC section order, with the tests that name it."""

from __future__ import annotations

from cpkv.gov.check import CheckResult


def report_lines(result: CheckResult) -> list[str]:
    """Rows ``clause  kind  status  test`` (one line per test, ``-`` when none), aligned in columns."""
    order = {cid: i for rfc in result.rfcs for i, cid in enumerate(c for _, ids in rfc.sections for c in ids)}
    clauses = sorted(result.clauses, key=lambda c: (c.rfc_dir, order.get(c.id, len(order)), c.id))
    rows = [("clause", "kind", "status", "tests")]
    for c in clauses:
        tests = result.links.get(c.id) or ["-"]
        rows.append((c.id, c.kind, c.status, tests[0]))
        rows += [("", "", "", t) for t in tests[1:]]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {s:<{widths[2]}}  {t}".rstrip() for a, b, s, t in rows]
