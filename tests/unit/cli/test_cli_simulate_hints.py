"""`cpkv simulate --page-size 1` says why it is slow: one note line on stderr, none at the default."""

import pytest

from cpkv.cli import main

pytestmark = pytest.mark.unit

ARGS = [
    "simulate",
    "--max-requests",
    "2",
    "--policy",
    "rotation",
    "--pages-per-lane",
    "4096",
    "--cp-size",
    "4",
    "--no-progress",
    "--cost-model",
    "illustrative",
]


def test_page_size_one_prints_one_note(tmp_path, capsys):
    assert main([*ARGS, "--page-size", "1", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert err == (
        "cpkv: note: --page-size 1 gives 64x the pages of --page-size 64: the replay runs several times "
        "slower (10x or more at 1), and 4,096 pages per lane hold only 4,096 tokens\n"
    )


@pytest.mark.parametrize("page_size", ["16", "64"])
def test_usual_page_sizes_print_no_note(page_size, tmp_path, capsys):
    assert main([*ARGS, "--page-size", page_size, "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().err == ""
