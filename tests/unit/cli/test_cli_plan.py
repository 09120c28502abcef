"""`cpkv plan`: JSON output equals the SPEC examples; bad input exits 2 with one line."""

import json

import pytest

from cpkv.cli import main

pytestmark = pytest.mark.unit


@pytest.mark.clause("C-HEAD")
def test_plan_json_spec_example(capsys):
    rc = main(
        [
            "plan",
            "--prefix-len",
            "100",
            "--extend-len",
            "200",
            "--page-size",
            "64",
            "--cp-size",
            "4",
            "--head-owner",
            "1",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    req = out["requests"][0]
    assert (req["phase"], req["head_tokens"], req["page_owners"]) == (1, 28, [1, 2, 3])
    assert out["per_rank_tokens"] == [0, 92, 64, 44]
    assert out["mqa_logits_elements"] == [0, 92 * 192, 64 * 256, 44 * 300]


def test_plan_req_index_and_batch_file(tmp_path, capsys):
    assert (
        main(
            [
                "plan",
                "--prefix-len",
                "0",
                "--extend-len",
                "1000",
                "--req-index",
                "1",
                "--cp-size",
                "4",
                "--json",
            ]
        )
        == 0
    )
    req = json.loads(capsys.readouterr().out)["requests"][0]
    assert (req["req_index"], req["phase"], req["per_rank_tokens"]) == (1, 1, [256, 232, 256, 256])
    f = tmp_path / "batch.json"
    f.write_text(json.dumps([{"prefix_len": 0, "extend_len": 64}] * 4))
    assert main(["plan", "--batch", str(f), "--cp-size", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["page_owners"] for r in out["requests"]] == [[0], [1], [2], [3]]


def test_plan_table_shows_lane_strip(capsys):
    assert main(["plan", "--prefix-len", "0", "--extend-len", "1000", "--cp-size", "4"]) == 0
    assert "0011223333221100" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prefix-len", "-1", "--extend-len", "5"], "prefix_len=-1"),
        (["--prefix-len", "100", "--extend-len", "5"], "head_owner"),
        (["--prefix-len", "0", "--extend-len", "5", "--cp-size", "0"], "cp_size must be >= 1, got 0"),
        (["--prefix-len", "0", "--extend-len", "x"], "'x' is not a valid integer"),
        (["--prefix-len", "0"], "one --prefix-len per --extend-len"),
        (["--batch", "/nonexistent.json"], "/nonexistent.json"),
    ],
)
@pytest.mark.clause("C-FAIL-FAST")
def test_plan_bad_input_exits_2_one_line(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cpkv: error:") and message in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--prefix-len", "0", "--extend-len", "100000000000"],
            "bytes (2,258.5 GiB) of arrays, above cpkv's limit",
        ),
        (
            ["--prefix-len", "10000000000000", "--extend-len", "8000000", "--head-owner", "0"],
            "overflows int64",
        ),
        (["--prefix-len", "100", "--extend-len", "5", "--head-owner", "-2"], "head_owner=-2 out of range"),
    ],
)
@pytest.mark.clause("C-FAIL-FAST")
def test_plan_huge_or_out_of_range_values_exit_2(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe", "cannot read batch file"),
        (b'[{"prefix_len": 0, "extend_len": 5, "head_ownr": 1}]', "unknown keys ['head_ownr']"),
        (b"[]", "non-empty JSON list"),
        (b'[{"prefix_len": "0", "extend_len": 5}]', "entry 0 must hold integers"),
    ],
)
def test_plan_bad_batch_files(content, message, tmp_path, capsys):
    f = tmp_path / "b.json"
    f.write_bytes(content)
    assert main(["plan", "--batch", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
