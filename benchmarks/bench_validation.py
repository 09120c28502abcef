"""cpkv's measured prices against a measured CP run: one DSA prefill layer at CP 8, per segment.

    python benchmarks/bench_validation.py [--quick] [--json PATH]

The reference is the nsys timeline in aiconfigurator's ``docs/CONTEXT_PARALLEL_DSA_MODELING.md`` (sections
7 and 8): GLM-5-NVFP4 on 8 B200, SGLang, ``attn_cp_size`` 8, one 32,768-token prompt, device 0, one
RS-to-RS layer period. It was deployed as: the prompt split round-robin over the 8 ranks (4,096 query
tokens each, spread over the whole context), the KV all-gathered before attention (``AG_KV``: the index key
in bf16, ``AG_LSE``: the 576-wide latent in bf16), the MoE tensor-parallel over the 8 GPUs (``moe_tp`` 8,
``ep`` 1) on the full 32,768 tokens between an all-gather of the hidden states (``AG_hidden``) and one
reduce-scatter (``RS``). cpkv composes the same layer from its own price tables (``cpkv.cost``) of the
nearest GLM-5 tables the installed aiconfigurator holds on ``b200_sxm`` (sglang 0.5.14:
``nvidia/GLM-5.2-NVFP4``, the same shapes as GLM-5 with NVFP4 experts, as run; ``zai-org/GLM-5-FP8``, the
same model with FP8 experts, for comparison): every table is the whole model's, so a layer is the table
over its 78 layers.

- DSA (attention, no big comm): the attention module of one rank's 4,096 tokens (``tables.attention``,
  prefix 0, as aiconfigurator's base), its indexer moved to the round-robin split's MQA-logits elements
  (every query scores its whole causal context: ``32768 * 32769 / 2 / 8`` per rank instead of the
  base's ``4096 * 4097 / 2``, at ``tables.indexer_ms_per_element``), plus ``AG_KV`` and ``AG_LSE`` (the
  NCCL all-gather table at 8 GPUs, ``4096 * 256`` and ``4096 * 1152`` bytes per rank);
- AG_hidden, RS: the NCCL all-gather / reduce-scatter tables, ``4096 * hidden * 2`` bytes per rank;
- MoE: ``tables.group`` (shared expert, router, routed experts at ``moe_tp`` 8) of the 32,768 tokens.

Every figure is microseconds per layer. The measured column is the document's; "aiconfigurator" is its own
prediction there (section 8; mqa and topk are inside DSA). Needs the ``cost`` extra; without it the
script says so and exits 0. ``--quick`` prices the first model only.
"""

from __future__ import annotations

from _common import parser, print_table, write_json

GPU = "b200_sxm"
MODELS = ("nvidia/GLM-5.2-NVFP4", "zai-org/GLM-5-FP8")
CP, ISL = 8, 32768
MEASURED = {
    "DSA (attention, no big comm)": 3808.0,
    "  of which AG_KV": 55.0,
    "  of which AG_LSE": 94.0,
    "AG_hidden": 622.0,
    "MoE": 2430.0,
    "RS": 610.0,
    "layer (RS to RS)": 7470.0,
}
"""Measured microseconds, aiconfigurator docs/CONTEXT_PARALLEL_DSA_MODELING.md sections 7 and 8."""
AIC_PREDICTED = {
    "DSA (attention, no big comm)": 4537.0,
    "  of which AG_KV": 54.0,
    "  of which AG_LSE": 100.0,
    "AG_hidden": 628.0,
    "MoE": 2047.0,
    "RS": 658.0,
    "layer (RS to RS)": 7870.0,
}
"""aiconfigurator's own prediction of the same layer (the document's section 8)."""
INDEX_KEY_BF16, LATENT_BF16 = 128 * 2, 576 * 2


def cpkv_layer(model: str) -> dict[str, float]:
    """cpkv's price of each segment of the layer, microseconds (module docstring)."""
    from cpkv.cost import MeasuredCost, MeasuredSpec

    cost = MeasuredCost.load(MeasuredSpec(gpu=GPU, model=model, backend="sglang", ep_size=1), CP)
    t, comm = cost.tables, cost.comm
    layers = t.num_layers
    per_rank = ISL // CP
    base = float(t.attention(per_rank, 0)) / layers
    elements = ISL * (ISL + 1) / 2 / CP - per_rank * (per_rank + 1) / 2  # round-robin's extra MQA logits
    indexer = t.indexer_ms_per_element * elements / layers
    ag_kv = float(comm.allgather_ms(per_rank * INDEX_KEY_BF16, CP))
    ag_lse = float(comm.allgather_ms(per_rank * LATENT_BF16, CP))
    hidden = per_rank * t.hidden_size * 2
    out = {
        "DSA (attention, no big comm)": base + indexer + ag_kv + ag_lse,
        "  of which AG_KV": ag_kv,
        "  of which AG_LSE": ag_lse,
        "AG_hidden": float(comm.allgather_ms(hidden, CP)),
        "MoE": float(t.group(ISL)) / layers,
        "RS": float(comm.reduce_scatter_ms(hidden, CP)),
    }
    out["layer (RS to RS)"] = sum(out[k] for k in ("DSA (attention, no big comm)", "AG_hidden", "MoE", "RS"))
    return {k: v * 1000 for k, v in out.items()}  # ms -> us


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args()
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        print("skipped: aiconfigurator is not importable (pip install '.[cost]' in a cpkv checkout)")
        return
    from cpkv.cost.coverage import ERROR_BAND

    models = MODELS[:1] if args.quick else MODELS
    ours = {m: cpkv_layer(m) for m in models}
    rows = []
    for segment, measured in MEASURED.items():
        row = [segment, measured, AIC_PREDICTED[segment]]
        for m in models:
            v = ours[m][segment]
            row += [v, 100 * (v / measured - 1)]
        rows.append(row)
    header = ["segment", "measured us", "aiconfigurator us"]
    for m in models:
        short = m.split("/")[1]
        header += [f"cpkv us ({short})", "diff %"]
    print_table(
        f"One DSA prefill layer, CP {CP}, {ISL:,}-token prompt, round-robin split, KV all-gathered, MoE TP "
        f"{CP}: cpkv ({GPU}, sglang tables) against the measured run of aiconfigurator's "
        "docs/CONTEXT_PARALLEL_DSA_MODELING.md (GLM-5-NVFP4, 8 x B200)",
        header,
        rows,
    )
    print(f"error band of cpkv's absolute times: {ERROR_BAND}")
    write_json(
        args.json,
        {
            "quick": args.quick,
            "cp_size": CP,
            "isl": ISL,
            "gpu": GPU,
            "measured_us": MEASURED,
            "aiconfigurator_predicted_us": AIC_PREDICTED,
            "cpkv_us": ours,
            "error_band": ERROR_BAND,
        },
    )


if __name__ == "__main__":
    main()
