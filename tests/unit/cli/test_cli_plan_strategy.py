"""`cpkv plan --cp-strategy` (C-INTERLEAVE): the strategy's acceptance line, JSON, the environment variable
and bad values (one error line, exit 2)."""

import json

import pytest

from cpkv.cli import main

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-INTERLEAVE")]

ACCEPTANCE = [
    "plan",
    "--cp-strategy",
    "interleave",
    "--cp-size",
    "4",
    "--prefix-len",
    "0",
    "--extend-len",
    "1000",
]


def test_acceptance_prints_the_round_robin_strip_and_tokens(capsys, monkeypatch):
    monkeypatch.delenv("CPKV_CP_STRATEGY", raising=False)
    assert main(ACCEPTANCE) == 0
    out = capsys.readouterr().out
    assert "0123012301230123" in out and "256 256 256 232" in out and "cp_strategy=interleave" in out
    assert main(["plan", "--cp-size", "4", "--prefix-len", "0", "--extend-len", "1000"]) == 0
    out = capsys.readouterr().out  # the default is zigzag
    assert "0011223333221100" in out and "232 256 256 256" in out and "cp_strategy=zigzag" in out


def test_json_names_the_strategy_and_the_env_var_is_the_default(capsys, monkeypatch):
    monkeypatch.setenv("CPKV_CP_STRATEGY", "interleave")
    argv = ["plan", "--cp-size", "2", "--page-size", "1", "--prefix-len", "0", "--extend-len", "5", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cp_strategy"] == "interleave"
    assert out["requests"][0]["page_owners"] == [0, 1, 0, 1, 0] and out["per_rank_tokens"] == [3, 2]
    assert main([*argv, "--cp-strategy", "zigzag"]) == 0  # the flag wins over the variable
    out = json.loads(capsys.readouterr().out)
    assert out["cp_strategy"] == "zigzag" and out["requests"][0]["page_owners"] == [0, 0, 1, 1, 0]


@pytest.mark.clause("C-FAIL-FAST")
def test_bad_strategy_is_one_error_line(capsys, monkeypatch):
    monkeypatch.delenv("CPKV_CP_STRATEGY", raising=False)
    assert main(["plan", "--cp-strategy", "ring", "--prefix-len", "0", "--extend-len", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'ring'" in err and "zigzag" in err and "interleave" in err
    monkeypatch.setenv("CPKV_CP_STRATEGY", "ring")
    assert main(["plan", "--prefix-len", "0", "--extend-len", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CPKV_CP_STRATEGY='ring'" in err
