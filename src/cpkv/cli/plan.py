"""``cpkv plan``: owner plans of one request or a batch, as a table or JSON (rendering in ``plan_view.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..config import CP_STRATEGIES, DEFAULT_PAGE_SIZE, OWNER_POLICIES, CPConfig
from ..errors import InputError
from ..sim.config import SimConfig
from ..validate import duplicate_key, duplicate_key_line
from .options import FilePath


@click.command()
@click.option(
    "--prefix-len",
    type=int,
    multiple=True,
    help="Tokens already cached; repeat once per request [0 for every request when not given].",
)
@click.option("--extend-len", type=int, multiple=True, help="New tokens; repeat once per request.")
@click.option(
    "--page-size", type=int, default=DEFAULT_PAGE_SIZE, show_default=True, help="Tokens per KV page (P)."
)
@click.option(
    "--cp-size",
    type=int,
    default=SimConfig.cp_size,
    show_default=True,
    help="Ranks in the CP group (C), at most 4096 (cpkv.limits.MAX_CP_SIZE).",
)
@click.option("--req-index", type=int, default=None, help="Batch position of a single request (phase input).")
@click.option(
    "--head-owner", type=int, multiple=True, help="Lane of each request's last_loc page (-1: none)."
)
@click.option(
    "--policy",
    type=click.Choice(list(OWNER_POLICIES)),
    default=None,
    help="Owner policy (default: $CPKV_OWNER_POLICY, else balanced).",
)
@click.option(
    "--cp-strategy",
    type=click.Choice(list(CP_STRATEGIES)),
    default=None,
    help="How new pages go to lanes: zigzag (2C segments) or interleave (page k on lane "
    "(phase + k) % C, SGLang's round robin) (default: $CPKV_CP_STRATEGY, else zigzag).",
)
@click.option(
    "--batch",
    type=FilePath(),
    default=None,
    help="JSON list of {prefix_len, extend_len[, head_owner]} instead of the flags.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(
    prefix_len, extend_len, page_size, cp_size, req_index, head_owner, policy, cp_strategy, batch, as_json
) -> None:
    """Plan page owners for one request or a batch: phase, lane strip, per-rank tokens, MQA-logits.

    \b
    The "page owners" column has one character per new page: the lane
    that owns it (0-9, then a-z). Above 96 pages, or with more than 36
    lanes, it is run-length encoded as LANExCOUNT: "0x13 1x13 2x13" is
    13 pages on lane 0, then 13 on lane 1, then 13 on lane 2.
    """
    prefix_len, extend_len, head_owner = list(prefix_len), list(extend_len), list(head_owner)
    from ..planner import plan_batch, plan_request
    from ..policy import follows_free_pages
    from .plan_view import plan_to_dict, print_plan

    if batch is not None:
        if prefix_len or extend_len or head_owner:
            raise InputError("--batch cannot be combined with --prefix-len/--extend-len/--head-owner")
        prefix_len, extend_len, head_owner = read_batch_file(batch)
    if not prefix_len and not extend_len:
        raise InputError("give at least one request (--prefix-len N --extend-len M, or --batch FILE)")
    if extend_len and not prefix_len and batch is None:
        prefix_len = [0] * len(extend_len)  # nothing cached: `cpkv plan --extend-len 64` plans a fresh prompt
    if len(prefix_len) != len(extend_len):
        raise InputError(
            f"give one --prefix-len per --extend-len (got {len(prefix_len)} and {len(extend_len)})"
        )
    if head_owner and len(head_owner) != len(extend_len):
        raise InputError(
            f"give one --head-owner per request or none (got {len(head_owner)} for {len(extend_len)})"
        )
    config = CPConfig(cp_size, page_size, policy, cp_strategy)
    heads = [None if h == -1 else h for h in head_owner] if head_owner else None
    if req_index is not None:
        if len(extend_len) != 1:
            raise InputError(f"--req-index={req_index} applies to a single request, got {len(extend_len)}")
        one = plan_request(
            prefix_len[0], extend_len[0], config, req_index=req_index, head_owner=(heads or [None])[0]
        )
        summary = plan_to_dict(one, config)
    else:
        summary = plan_to_dict(plan_batch(prefix_len, extend_len, config, head_owners=heads))
    flag = "head_owner" if batch is not None else "--head-owner"
    for line in ignored_head_owners(summary["requests"], heads or [], page_size, flag):
        click.echo(f"cpkv: warning: {line}", err=True)
    if follows_free_pages(config.owner_policy):
        click.echo(
            "cpkv: note: under balanced the allocator chooses each phase from the lanes' free pages "
            "(C-BALANCED); the planner alone, shown here, uses the rotation rule",
            err=True,
        )
    if as_json:
        dump_json(summary)
    else:
        print_plan(summary)


def ignored_head_owners(
    requests: list[dict], heads: list[int | None], page_size: int, flag: str
) -> list[str]:
    """One line per request given a head owner that its plan ignores: it has no head tokens (C-HEAD)
    because its prefix fills whole pages or it computes nothing. ``requests``: ``plan_to_dict`` rows."""
    lines = []
    for i, (r, head) in enumerate(zip(requests, heads, strict=False)):
        if head is None or r["head_tokens"]:
            continue
        why = (
            f"prefix_len={r['prefix_len']} fills whole pages"
            if r["prefix_len"] % page_size == 0
            else f"extend_len={r['extend_len']} computes no token"
        )
        lines.append(f"request {i}: {flag} {head} is ignored: {why} (no head tokens)")
    return lines


def read_batch_file(path: Path) -> tuple[list[int], list[int], list[int]]:
    """Read ``[{"prefix_len": int, "extend_len": int, "head_owner"?: int | null}, ...]`` from ``path``.

    Raises:
        InputError: unreadable file, bad JSON, a key written twice in one object (names file, line and key)
            or a bad entry (names the file and the entry index).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
        rows = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read batch file: {e}") from None
    key = duplicate_key(text)
    if key is not None:
        raise InputError(
            f"{path}:{_duplicate_line(text, key)}: key {key!r} appears twice in one object (refused: "
            "JSON readers keep the last value without a word)"
        )
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{path}: expected a non-empty JSON list of requests")
    out: tuple[list[int], list[int], list[int]] = ([], [], [])
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not {"prefix_len", "extend_len"} <= row.keys():
            raise InputError(f"{path}: entry {i} needs prefix_len and extend_len, got {row!r}")
        unknown = sorted(row.keys() - {"prefix_len", "extend_len", "head_owner"})
        if unknown:
            raise InputError(
                f"{path}: entry {i} has unknown keys {unknown} (use prefix_len, extend_len, head_owner)"
            )
        head = row.get("head_owner")
        values = (row["prefix_len"], row["extend_len"], -1 if head is None else head)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise InputError(f"{path}: entry {i} must hold integers, got {row!r}")
        for lst, v in zip(out, values, strict=True):
            lst.append(v)
    return out


def _duplicate_line(text: str, key: str) -> int:
    """Line of the second ``key`` in the first entry of the batch list that repeats it (line 1 otherwise)."""
    decoder, pos = json.JSONDecoder(), text.index("[") + 1 if "[" in text else 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            _, end = decoder.raw_decode(text, pos)
        except ValueError:
            return 1
        twice = duplicate_key(text[pos:end])
        if twice is not None:
            return duplicate_key_line(text, pos, end, twice)
        pos = end


def dump_json(obj: object) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    click.echo(json.dumps(obj, indent=2))
