"""bench_validation.py composes the measured CP layer from cpkv's tables: each segment is
the price its docstring names, and the layer is their serial sum."""

import sys
from pathlib import Path

import pytest

from extras import COST

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]


def test_the_layer_is_the_sum_of_its_priced_segments():
    COST.require()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_validation as bv
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from cpkv.cost import MeasuredCost, MeasuredSpec

    ours = bv.cpkv_layer(bv.MODELS[0])
    assert set(ours) == set(bv.MEASURED) == set(bv.AIC_PREDICTED)
    parts = ("DSA (attention, no big comm)", "AG_hidden", "MoE", "RS")
    assert ours["layer (RS to RS)"] == pytest.approx(sum(ours[k] for k in parts))
    cost = MeasuredCost.load(MeasuredSpec(gpu="b200_sxm", model=bv.MODELS[0], ep_size=1), 8)
    assert cost.tables.moe_tp_size == 8 and cost.tables.num_layers == 78  # MoE as it was run: TP 8, EP 1
    assert ours["  of which AG_KV"] == pytest.approx(
        1000 * cost.comm.allgather_ms(4096 * 256, 8)
    )  # bf16 index key
    assert ours["  of which AG_LSE"] == pytest.approx(1000 * cost.comm.allgather_ms(4096 * 1152, 8))
    assert ours["MoE"] == pytest.approx(1000 * float(cost.tables.group(32768)) / 78)
    assert bv.MEASURED["layer (RS to RS)"] == sum(
        bv.MEASURED[k] for k in parts
    )  # the document: segments sum to the period
