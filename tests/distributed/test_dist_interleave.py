"""``cpkv run-dist --cp-strategy interleave`` (SPEC C-INTERLEAVE): the arguments of the zigzag
executor tests (``test_dist_cli.py``), dense and NSA, ``--kv-access shared`` and ``local``, chunked prefill
and decode, equal the single-process reference within ``TOLERANCE`` and decode the same tokens as under
zigzag; every forward's per-rank tokens and MQA-logits counts are the oracle's under the strategy."""

import json

import pytest
from click.testing import CliRunner

import oracle
from cpkv.executor.cli_entry import TOLERANCE, run_dist_cli

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300), pytest.mark.clause("C-INTERLEAVE")]

ARGS = [
    "--page-size",
    "16",
    "--prefix-len",
    "0",
    "--extend-len",
    "9",
    "--prefix-len",
    "21",
    "--extend-len",
    "40",
    "--chunks",
    "3",
    "--seed",
    "1",
]
"""``test_dist_cli.ARGS``: the zigzag tests' requests."""
NSA = ["--attention", "nsa", "--index-topk", "8", "--index-heads", "4"]
SHARED = ["--pages-per-lane", "9,8"]
"""``test_run_dist_nsa_json_with_unequal_lanes``'s extra flags (shared access)."""
LOCAL = ["--kv-access", "local", "--decode-steps", "2", "--no-reuse"]
"""``test_run_dist_local_decode_json_and_its_text``'s extra flags."""
MANY_PAGES = [
    "--page-size",
    "4",
    "--prefix-len",
    "0",
    "--extend-len",
    "61",
    "--prefix-len",
    "13",
    "--extend-len",
    "50",
    "--chunks",
    "2",
    "--decode-steps",
    "3",
    "--no-reuse",
    "--seed",
    "2",
]
"""Chunks of up to 8 new pages at P=4, so on 2 ranks the strategies put pages on other lanes (m > C)."""


def _run(strategy: str, *flags: str) -> dict:
    res = CliRunner().invoke(run_dist_cli, ["--cp-size", "2", "--json", "--cp-strategy", strategy, *flags])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _check(out: dict, strategy: str) -> None:
    """The run is OK within the tolerance, ran under ``strategy``, and every forward's per-rank tokens (and
    for NSA each rank's logits elements) are the oracle's for its lengths, phases and head owners."""
    assert out["ok"] is True and out["max_abs_err"] <= TOLERANCE == out["tolerance"]
    assert out["cp_strategy"] == strategy and out["unwritten_rows_intact"] is True
    C, P = out["cp_size"], out["page_size"]
    for f in out["forwards"]:
        want = oracle.plan_batch(
            f["prefix_lens"], f["extend_lens"], C, P, f["head_owners"], f["phases"], strategy=strategy
        )
        assert f["per_rank_tokens"] == want["per_rank_tokens"], f
        if out["attention"] == "nsa" and out["kv_access"] == "shared":
            assert f["logits_estimated"] == oracle.mqa_logits_elements(
                f["prefix_lens"],
                f["extend_lens"],
                C,
                P,
                head_owners=f["head_owners"],
                phases=f["phases"],
                strategy=strategy,
            )
            assert f["logits_measured"] == [[e, e] for e in f["logits_estimated"]]
    for d in out["decodes"]:
        assert d["tokens"] == d["reference_tokens"] and d["max_abs_err"] <= TOLERANCE


def _tokens(out: dict) -> dict:
    """Request id -> its decoded tokens."""
    return {r: t for d in out["decodes"] for r, t in zip(d["request_ids"], d["tokens"], strict=True)}


@pytest.mark.parametrize("access", ["shared", "local"])
def test_interleave_with_the_zigzag_tests_arguments(access):
    """The zigzag NSA tests' flags (shared: unequal lanes 9,8; local: decode 2 steps) under interleave."""
    flags = [*SHARED, *NSA, *ARGS] if access == "shared" else [*LOCAL, *NSA, *ARGS]
    inter, zig = _run("interleave", *flags), _run("zigzag", *flags)
    _check(inter, "interleave")
    _check(zig, "zigzag")
    assert inter["kv_access"] == access and inter["logits_match"] is True
    assert inter["topk_mismatched"] == inter["topk_near_tie"]
    assert _tokens(inter) == _tokens(zig)
    if access == "local":
        assert inter["tokens_match"] is True and sorted(_tokens(inter)) == [0, 1]
    assert sum(inter["per_rank_tokens"]) == sum(zig["per_rank_tokens"])


@pytest.mark.parametrize("access", ["shared", "local"])
def test_interleave_puts_pages_elsewhere_and_decodes_the_same_tokens(access):
    """Dense attention, chunks of up to 8 pages on 2 ranks: interleave's per-rank tokens differ from
    zigzag's in some forward (the strategy is in force), the outputs match the reference and 3 greedy decode
    steps per request give zigzag's tokens."""
    flags = [*MANY_PAGES, "--kv-access", access]
    inter, zig = _run("interleave", *flags), _run("zigzag", *flags)
    _check(inter, "interleave")
    _check(zig, "zigzag")
    assert inter["tokens_match"] is True and zig["tokens_match"] is True
    assert _tokens(inter) == _tokens(zig) and sorted(_tokens(inter)) == [0, 1]
    assert all(len(t) == 3 for t in _tokens(inter).values())
    assert [f["per_rank_tokens"] for f in inter["forwards"]] != [
        f["per_rank_tokens"] for f in zig["forwards"]
    ]
    assert sum(inter["per_rank_tokens"]) == sum(zig["per_rank_tokens"]) == 61 + 13 + 50


def test_run_dist_refuses_an_unknown_strategy():
    res = CliRunner().invoke(run_dist_cli, ["--cp-size", "2", "--cp-strategy", "diagonal", *ARGS])
    assert res.exit_code == 2 and "'diagonal' is not one of 'zigzag', 'interleave'" in res.output
