"""`cpkv plan --extend-len N` alone plans a fresh prompt (prefix 0 for every request); repeated
--prefix-len/--extend-len pairs plan as before, and a count mismatch is still one error line."""

import json

import pytest

from cpkv import CPConfig, plan_batch
from cpkv.cli import main

pytestmark = pytest.mark.unit


def _plan(capsys, *argv):
    assert main(["plan", "--cp-size", "4", "--policy", "rotation", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_extend_len_alone_is_prefix_zero(capsys):
    alone = _plan(capsys, "--extend-len", "64")
    assert alone == _plan(capsys, "--prefix-len", "0", "--extend-len", "64")
    assert [r["prefix_len"] for r in alone["requests"]] == [0]
    assert alone["per_rank_tokens"] == [64, 0, 0, 0]


def test_repeated_extend_len_alone_is_a_batch_of_fresh_prompts(capsys):
    out = _plan(capsys, "--extend-len", "64", "--extend-len", "200", "--extend-len", "1000")
    want = plan_batch([0, 0, 0], [64, 200, 1000], CPConfig(4, 64, "rotation"))
    assert [r["prefix_len"] for r in out["requests"]] == [0, 0, 0]
    assert out["per_rank_tokens"] == want.per_rank_tokens.tolist()
    assert [r["page_owners"] for r in out["requests"]] == [p.page_owners.tolist() for p in want.requests]


def test_prefix_and_extend_pairs_still_plan_as_given(capsys):
    out = _plan(
        capsys, "--prefix-len", "128", "--extend-len", "64", "--prefix-len", "0", "--extend-len", "200"
    )
    want = plan_batch([128, 0], [64, 200], CPConfig(4, 64, "rotation"))
    assert [(r["prefix_len"], r["extend_len"]) for r in out["requests"]] == [(128, 64), (0, 200)]
    assert [r["page_owners"] for r in out["requests"]] == [p.page_owners.tolist() for p in want.requests]
    assert out["per_rank_tokens"] == want.per_rank_tokens.tolist()


@pytest.mark.parametrize(
    "argv",
    [
        ["--prefix-len", "0", "--extend-len", "5", "--extend-len", "6"],
        ["--prefix-len", "0", "--prefix-len", "0"],
    ],
)
def test_a_prefix_count_that_does_not_match_is_still_refused(argv, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    n_prefix, n_extend = argv.count("--prefix-len"), argv.count("--extend-len")
    assert err == (f"cpkv: error: give one --prefix-len per --extend-len (got {n_prefix} and {n_extend})\n")
