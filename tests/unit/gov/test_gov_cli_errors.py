"""`python -m cpkv.gov` errors use the `cpkv: error:` form of the cpkv CLI: one line on stderr, exit 2."""

import subprocess
import sys

import pytest

from cpkv.gov.__main__ import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "cpkv: error: the following arguments are required: command (see python -m cpkv.gov --help)\n"),
        (
            ["check", "--bogus"],
            "cpkv: error: unrecognized arguments: --bogus (see python -m cpkv.gov --help)\n",
        ),
    ],
)
def test_usage_errors_are_one_cpkv_error_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", message)


def test_unknown_command_is_one_cpkv_error_line(capsys):
    assert main(["lint"]) == 2
    err = capsys.readouterr().err  # argparse quotes the choices on some Python versions only
    assert err.startswith("cpkv: error: argument command: invalid choice: 'lint'") and err.count("\n") == 1
    assert err.endswith("(see python -m cpkv.gov --help)\n")


def test_missing_gov_dir_and_spec_use_the_cpkv_error_form(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 2
    assert capsys.readouterr().err == "cpkv: error: no gov/ directory in the CWD or above; pass --root DIR\n"
    (tmp_path / "gov").mkdir()
    assert main(["check", "--root", str(tmp_path), "--spec", "nope.md"]) == 2
    err = capsys.readouterr().err
    assert err == f"cpkv: error: --spec nope.md: no such file (relative to the root {tmp_path})\n"


@pytest.mark.slow
def test_module_entry_point_exit_status(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cpkv.gov", "check", "--bogus"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert (
        proc.stderr.startswith("cpkv: error: unrecognized arguments: --bogus")
        and proc.stderr.count("\n") == 1
    )
