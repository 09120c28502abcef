"""Governance checker: the project's RFC, its clauses, work items and clause-to-test links.

Run it as ``python -m cpkv.gov check`` (see ``docs/governance.md``). The RFC under ``gov/rfc/`` restates
the clauses of the SPEC; every active normative clause must be named by at least one test through
``@pytest.mark.clause("C-...")``. Tests are read by AST parse only: the checker neither imports nor runs
them. This package imports no other cpkv module.
"""

from cpkv.gov.check import CheckResult, run_check
from cpkv.gov.model import Problem

__all__ = ["CheckResult", "Problem", "run_check"]
