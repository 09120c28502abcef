"""Where the data ends: a GPU / engine / model without installed measurements is one line
naming what exists, exit 2; a run priced past the measured tables warns on one line and records it in the
report's ``cost_provenance``; the GLM-5 family prices where aiconfigurator has its DSA tables."""

import json

import pytest

from cpkv.cli import main
from cpkv.cost import CostModelError, MeasuredSpec
from extras import COST

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-COST")]


@pytest.fixture(autouse=True)
def _needs_cost():
    COST.require()


def test_combinations_without_data_name_what_exists():
    from cpkv.cost.coverage import check_covered

    check_covered(MeasuredSpec(), 8)  # the default prices
    check_covered(MeasuredSpec(model="zai-org/GLM-5"), 8)
    with pytest.raises(CostModelError, match=r"only on sglang; --backend vllm prices --cp-size 1 only"):
        check_covered(MeasuredSpec(backend="vllm"), 8)
    check_covered(MeasuredSpec(backend="vllm"), 1)  # vLLM's DSA module is measured: one GPU prices
    with pytest.raises(
        CostModelError,
        match=r"no vllm measurements of 'zai-org/GLM-5-FP8' on h200_sxm; it holds "
        r"deepseek-ai/DeepSeek-V3.2, zai-org/GLM-5$",
    ):
        check_covered(MeasuredSpec(model="zai-org/GLM-5-FP8", backend="vllm"), 1)
    with pytest.raises(CostModelError, match=r"on gpu 'a100_sxm'; sglang has them on .*h200_sxm"):
        check_covered(MeasuredSpec(gpu="a100_sxm"), 8)


def test_extrapolation_is_named():
    from cpkv.cost.coverage import extrapolated, nccl_gpus

    assert nccl_gpus("h200_sxm") == 8
    assert extrapolated(MeasuredSpec(), 8, 8192, 100_000) == []
    out = extrapolated(MeasuredSpec(), 16, 16384, 10**6)
    assert out[0].startswith("collectives over 16 GPUs (NCCL measured over at most 8")
    assert "attention runs of up to 16,384 query tokens (measured up to 8,192)" in out[1]
    assert out[2].startswith("contexts of up to 1,000,000 tokens")


def test_cli_cp_size_16_warns_on_one_line_and_records_it(tmp_path, capsys):
    out = tmp_path / "o"
    assert (
        main(
            [
                "simulate",
                "--workload",
                "synthetic",
                "--max-requests",
                "4",
                "--cp-size",
                "16",
                "--policy",
                "rotation",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cpkv: warning:")]
    assert len(err) == 1 and "collectives over 16 GPUs" in err[0]
    prov = json.loads((out / "report.json").read_text())["config"]["cost_provenance"]
    assert prov["extrapolated"] and prov["extrapolated"][0].startswith("collectives over 16 GPUs")
    assert "29.9 %" in prov["error_band"]


def test_cli_backend_without_data_is_one_line_exit_2(tmp_path, capsys):
    assert (
        main(
            [
                "simulate",
                "--workload",
                "synthetic",
                "--max-requests",
                "4",
                "--backend",
                "vllm",
                "--no-progress",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "cpkv: error: aiconfigurator composes context-parallel prefill"
    )
    assert not (tmp_path / "o").exists()


def test_glm5_prices_from_its_own_tables():
    from cpkv.cost import MeasuredCost

    cost = MeasuredCost.load(MeasuredSpec(model="zai-org/GLM-5"), 2)
    assert cost.tables.num_layers == 78 and cost.provenance()["model"] == "zai-org/GLM-5"
    assert cost.tables.kv_row_bytes == 1284 and cost.tables.kv_gather_row_bytes == 1408
