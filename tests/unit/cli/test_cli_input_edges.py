"""CLI input edges (C-FAIL-FAST): integers beyond int64, an empty path, flags named as the user gave them
and ``--cp-size`` above ``MAX_CP_SIZE``: each exits 2 with one line naming the flag or field and the
value, before any work and without writing a file."""

import time

import pytest

from cpkv.cli import main

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-FAIL-FAST")]

HUGE = "99999999999999999999"  # above int64 (9223372036854775807)
PLAN = ["plan", "--prefix-len", "0", "--extend-len", "64"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cpkv: error: ") and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [*PLAN, "--req-index", "99999999999999999999999"],
            "req_index must be <= 9007199254740992, got 99999999999999999999999",
        ),
        (
            [*PLAN, "--page-size", HUGE],
            f"page_size must be <= 9223372036854775807 (the int64 maximum), got {HUGE}",
        ),
        ([*PLAN, "--cp-size", HUGE], f"cp_size={HUGE} is above cpkv's limit of 4096 ranks"),
        (
            [*PLAN, "--head-owner", "-2"],
            "request 0: head_owner=-2 out of range [0, 8), or -1 (or None) for no head owner",
        ),
    ],
)
def test_plan_bad_ints_exit_2_naming_the_value(argv, message, capsys):
    assert main(argv) == 2
    assert message in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("--spec-draft-tokens", "spec_draft_tokens"),
        ("--page-size", "page_size"),
        ("--host-pages-per-lane", "host_pages_per_lane"),
        ("--max-requests", "--max-requests"),
    ],
)
def test_simulate_ints_beyond_int64_exit_2_naming_the_flag(flag, field, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["simulate", "--workload", "short-prompts", "--no-progress", "--out", str(out), flag, HUGE]
    assert main(argv) == 2
    assert f"{field} must be <= 9223372036854775807 (the int64 maximum), got {HUGE}" in _one_error_line(
        capsys
    )
    assert not out.exists()


def test_simulate_max_requests_names_the_flag(tmp_path, capsys):
    assert main(["simulate", "--no-progress", "--out", str(tmp_path / "o"), "--max-requests", "0"]) == 2
    assert _one_error_line(capsys) == "cpkv: error: --max-requests must be >= 1, got 0\n"


def test_simulate_max_requests_too_many_to_generate_exits_2(tmp_path, capsys):
    assert (
        main(["simulate", "--no-progress", "--out", str(tmp_path / "o"), "--max-requests", str(2**62)]) == 2
    )
    err = _one_error_line(capsys)
    assert f"a synthetic workload of {2**62:,} requests" in err and "--max-requests" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--workload", "short-prompts", "--no-progress", "--max-requests", "2", "--out", ""],
        ["simulate", "--trace", "", "--no-progress", "--out", "o"],
        ["plan", "--batch", ""],
    ],
)
def test_empty_path_is_a_usage_error_naming_the_flag(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    flag = argv[argv.index("") - 1]
    assert main(argv) == 2
    assert _one_error_line(capsys) == (
        f"cpkv: error: Invalid value for '{flag}': the path is empty; give a file or directory name\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written in the current directory


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--prefix-len", "0", "--extend-len", "10", "--cp-size", "10000000", "--json"],
        ["simulate", "--workload", "short-prompts", "--no-progress", "--cp-size", "100000"],
    ],
)
def test_cp_size_above_the_limit_exits_2_at_once(argv, tmp_path, capsys):
    start = time.perf_counter()
    assert main([*argv, *(["--out", str(tmp_path / "o")] if argv[0] == "simulate" else [])]) == 2
    assert time.perf_counter() - start < 5.0  # was 17 s (plan) and minutes (simulate)
    C = argv[argv.index("--cp-size") + 1]
    assert _one_error_line(capsys) == (
        f"cpkv: error: cp_size={C} is above cpkv's limit of 4096 ranks (cpkv.limits.MAX_CP_SIZE)\n"
    )
    assert capsys.readouterr().out == ""
