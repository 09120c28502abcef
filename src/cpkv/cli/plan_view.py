"""Human and JSON views of a plan (``BatchPlan`` or ``RequestPlan``): lane strips and plain dicts, for
``cpkv plan``."""

from __future__ import annotations

import sys
from typing import cast

import numpy as np

from ..config import CPConfig
from ..estimator import mqa_logits_elements
from ..plan import BatchPlan, RequestPlan
from ..runs import run_starts

_LANE_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"
STRIP_MAX_PAGES = 96
"""Longer page lists are shown run-length encoded (``lane x count``)."""


def lane_strip(page_owners: np.ndarray, cp_size: int) -> str:
    """A compact string of page owner lanes, one character per page (``0-9a-z`` for lane 0..35).

    Example ``[0,0,1,1,2,2,3,3]`` -> ``"00112233"``. Above ``STRIP_MAX_PAGES`` pages, or with more than 36
    lanes, runs are shown as ``lane x count`` (``"0x2 1x2 2x2 3x2"``). Empty -> ``"-"``.
    """
    owners = np.asarray(page_owners, dtype=np.int64)
    if owners.size == 0:
        return "-"
    if owners.size <= STRIP_MAX_PAGES and cp_size <= len(_LANE_CHARS):
        return "".join(_LANE_CHARS[o] for o in owners.tolist())
    starts = run_starts(owners)
    counts = np.diff(np.r_[starts, owners.size])
    return " ".join(f"{owners[s]}x{c}" for s, c in zip(starts.tolist(), counts.tolist(), strict=True))


def plan_to_dict(plan: BatchPlan | RequestPlan, config: CPConfig | None = None) -> dict:
    """JSON-ready summary of a plan: per request phase, head, page owners, per-rank tokens, last token
    owner; per batch per-rank tokens, max_rank_tokens and MQA-logits elements per rank (C-ESTIMATE).
    Values are ints and lists of ints (tokens, pages, elements). A ``RequestPlan`` (``plan_request``, at
    its own ``req_index``) is shown as a batch of that one request; it needs the ``config`` it was
    planned with (a ``BatchPlan`` carries its own)."""
    requests: tuple[RequestPlan, ...]
    if isinstance(plan, RequestPlan):  # needs the config (see above)
        cfg, requests, per_rank = cast(CPConfig, config), (plan,), plan.per_rank_tokens
        max_rank = max(per_rank.tolist(), default=0)
    else:
        cfg, requests, per_rank, max_rank = (
            plan.config,
            plan.requests,
            plan.per_rank_tokens,
            plan.max_rank_tokens,
        )
    return {
        "cp_size": cfg.cp_size,
        "page_size": cfg.page_size,
        "owner_policy": cfg.owner_policy,
        "cp_strategy": cfg.cp_strategy,
        "requests": [
            {
                "req_index": r.req_index,
                "prefix_len": r.prefix_len,
                "extend_len": r.extend_len,
                "phase": r.phase,
                "head_owner": r.head_owner,
                "head_tokens": r.head_tokens,
                "page_owners": r.page_owners.tolist(),
                "per_rank_tokens": r.per_rank_tokens.tolist(),
                "last_token_owner": r.last_token_owner,
            }
            for r in requests
        ],
        "per_rank_tokens": per_rank.tolist(),
        "max_rank_tokens": max_rank,
        "mqa_logits_elements": mqa_logits_elements(plan).tolist(),
    }


def print_plan(summary: dict) -> None:
    """Print a ``plan_to_dict`` summary as a rich table: one row per request, then the batch totals."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    C = summary["cp_size"]
    table = Table(
        title=f"cp_size={C} page_size={summary['page_size']} policy={summary['owner_policy']} "
        f"cp_strategy={summary['cp_strategy']}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for col in ("req", "prefix", "extend", "phase", "head:tokens"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("page owners (lane per page)", overflow="fold")
    table.add_column("tokens per rank", overflow="fold")
    table.add_column("last", justify="right", no_wrap=True)
    for r in summary["requests"]:
        head = "-" if r["head_owner"] is None else f"{r['head_owner']}:{r['head_tokens']}"
        table.add_row(
            str(r["req_index"]),
            str(r["prefix_len"]),
            str(r["extend_len"]),
            str(r["phase"]),
            head,
            lane_strip(np.asarray(r["page_owners"]), C),
            " ".join(map(str, r["per_rank_tokens"])),
            str(r["last_token_owner"]),
        )
    console = Console(width=None if sys.stdout.isatty() else 132)
    console.print(table)
    console.print(
        f"per_rank_tokens  {summary['per_rank_tokens']}  (max_rank_tokens {summary['max_rank_tokens']})"
    )
    console.print(f"mqa_logits_elements per rank  {summary['mqa_logits_elements']}")
