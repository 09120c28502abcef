"""Why the simulator rejects a request: the reasons in ``report.json``'s ``rejections``, one code each.

A reason is ``"<code>: <what>"``; ``rejection_reasons`` counts the codes (docs/metrics.md): ``pool`` (more
pages than the whole pool), ``lane`` (its policy's next page, or MTP step, has no lane even alone),
``logits_budget`` (a one-token chunk exceeds the budget, C-BUDGET).
"""

from __future__ import annotations


def pool_reason(pages: int, usable: int) -> str:
    """``pool``: the request needs ``pages`` pages at its peak, the pool has ``usable``."""
    return f"pool: needs {pages} pages but the pool has {usable} usable pages"


def lane_reason(policy: str, lane: int, capacity: int, what: str) -> str:
    """``lane``: ``policy`` puts the next page on ``lane``, whose ``capacity`` usable pages hold ``what``."""
    return (
        f"lane: policy {policy} puts the next page on lane {lane}, whose {capacity} usable pages hold {what}"
    )


def budget_reason(prefix_len: int, budget_elements: int | None) -> str:
    """``logits_budget``: one token at position ``prefix_len`` needs ``prefix_len + 1`` elements on one rank."""
    return (
        f"logits_budget: a one-token chunk at position {prefix_len} needs {prefix_len + 1} logits "
        f"elements on one rank, over the budget of {budget_elements}"
    )
