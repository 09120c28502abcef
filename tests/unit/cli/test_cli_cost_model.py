"""`cpkv simulate --cost-model measured|illustrative` (SPEC C-COST): the measured default, its provenance in
the report, one-line errors before any replay, and the missing extra named."""

import json
import subprocess
import sys

import pytest

from cpkv.cli import main
from extras import COST

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-COST")]

SMALL = [
    "simulate",
    "--workload",
    "synthetic",
    "--max-requests",
    "8",
    "--cp-size",
    "4",
    "--page-size",
    "16",
    "--pages-per-lane",
    "1024",
    "--policy",
    "balanced",
    "--no-progress",
]

_NO_AIC = """
import sys
class Block:  # the environment of a library-only install: aiconfigurator cannot be imported
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "aiconfigurator_core":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from cpkv.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_missing_extra_is_one_error_line_naming_it(tmp_path):
    out = tmp_path / "o"
    proc = subprocess.run(
        [sys.executable, "-c", _NO_AIC, *SMALL, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("cpkv: error: the measured cost model needs aiconfigurator")
    assert (
        "pip install '.[cost]' in a cpkv checkout" in proc.stderr
        and "--cost-model illustrative" in proc.stderr
    )
    assert not out.exists()  # failed before any replay or write
    # the illustrative model needs no extra
    ok = subprocess.run(
        [sys.executable, "-c", _NO_AIC, *SMALL, "--cost-model", "illustrative", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert (
        json.loads((out / "report.json").read_text())["config"]["cost_provenance"]["cost_model"]
        == "illustrative"
    )


def test_measured_only_flags_with_the_illustrative_model_exit_2(tmp_path, capsys):
    assert (
        main(
            [
                *SMALL,
                "--cost-model",
                "illustrative",
                "--gpu",
                "b200_sxm",
                "--ep-size",
                "2",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        err
        == "cpkv: error: --gpu, --ep-size apply only to --cost-model measured: drop them or use --cost-model measured\n"
    )
    assert main([*SMALL, "--cost-model", "illustrative", "--ep-size", "2", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (
        "cpkv: error: --ep-size applies only to --cost-model measured: drop it or use --cost-model measured\n"
    )


def test_measured_default_writes_its_provenance(tmp_path, capsys):
    COST.require()
    out = tmp_path / "o"
    assert main([*SMALL, "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert (
        "times: measured h200_sxm deepseek-ai/DeepSeek-V3.2 sglang 0.5.14 (aiconfigurator 0.12.0, EP 4)"
        in " ".join(table.split())
    )
    report = json.loads((out / "report.json").read_text())
    config = json.loads((out / "config.json").read_text())
    for c in (report["config"], config):
        p = c["cost_provenance"]
        assert (p["cost_model"], p["gpu"], p["model"], p["backend"], p["backend_version"], p["ep_size"]) == (
            "measured",
            "h200_sxm",
            "deepseek-ai/DeepSeek-V3.2",
            "sglang",
            "0.5.14",
            4,
        )
        assert p["aiconfigurator_version"] == "0.12.0" and p["data_version"] == "sglang 0.5.14, nccl 2.26.2"
        assert c["measured"] == {
            "gpu": "h200_sxm",
            "model": "deepseek-ai/DeepSeek-V3.2",
            "backend": "sglang",
            "ep_size": None,
        }
    assert report["policies"]["balanced"]["requests_finished"] == 8


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ep-size", "3"], "ep_size 3 must divide cp_size 4"),
        (["--ep-size", "0"], "ep_size must be an int >= 1"),
        (["--gpu", "h900"], "h900"),
    ],
)
def test_measured_errors_are_one_line_before_any_replay(argv, message, tmp_path, capsys):
    if "--gpu" in argv:
        COST.require()
    out = tmp_path / "o"
    assert main([*SMALL, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cpkv: error:") and message in err
    assert not out.exists()
