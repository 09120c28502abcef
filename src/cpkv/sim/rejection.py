"""Why the simulator rejects a request: the reasons in ``report.json``'s ``rejections``, one code each.

A reason is a ``Rejection(code, detail)``; ``report.json`` writes it as ``"<code>: <detail>"`` and
``rejection_reasons`` counts the codes (docs/metrics.md): ``pool`` (more pages than the whole pool), ``lane``
(its policy's next page, or MTP step, has no lane even alone), ``logits_budget`` (a one-token chunk exceeds
the budget, C-BUDGET).
"""

from __future__ import annotations

from typing import NamedTuple


class Rejection(NamedTuple):
    """One rejected request's reason: ``code`` (``pool`` | ``lane`` | ``logits_budget``) and ``detail``
    (what was short, one phrase). ``str`` is the report's text, e.g. ``Rejection("pool", "needs 125
    pages but the pool has 15 usable pages")`` -> ``"pool: needs 125 pages but the pool has 15 usable
    pages"``."""

    code: str
    detail: str

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


def pool_reason(pages: int, usable: int) -> Rejection:
    """``pool``: the request needs ``pages`` pages at its peak, the pool has ``usable``."""
    return Rejection("pool", f"needs {pages} pages but the pool has {usable} usable pages")


def lane_reason(policy: str, lane: int, capacity: int, what: str) -> Rejection:
    """``lane``: ``policy`` puts the next page on ``lane``, whose ``capacity`` usable pages hold ``what``."""
    return Rejection(
        "lane",
        f"policy {policy} puts the next page on lane {lane}, whose {capacity} usable pages hold {what}",
    )


def budget_reason(prefix_len: int, budget_elements: int | None) -> Rejection:
    """``logits_budget``: one token at position ``prefix_len`` needs ``prefix_len + 1`` elements on one rank."""
    return Rejection(
        "logits_budget",
        f"a one-token chunk at position {prefix_len} needs {prefix_len + 1} logits elements on one rank, "
        f"over the budget of {budget_elements}",
    )
