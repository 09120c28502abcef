"""A whole, consistent SGLang parallel topology for ``get_parallel().override`` in tests on one process.

SGLang validates every override against what is already readable in the process (another test's
published or permanently set widths included), so a test that states only ``attn_cp_size`` can clash with
an ``attn_tp_size`` set elsewhere. ``cp_topology`` states every width and rank the validation relates.
"""


def cp_topology(cp_size: int, cp_rank: int = 0) -> dict[str, int]:
    """Attention CP of ``cp_size`` ranks (this process rank ``cp_rank``), attention TP and DP 1, MoE TP over
    the same ranks: ``tp_size == attn_tp * attn_dp * attn_cp == moe_ep * moe_dp * moe_tp`` and
    ``tp_rank == (attn_dp_rank * attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank``."""
    return dict(
        tp_size=cp_size,
        tp_rank=cp_rank,
        attn_tp_size=1,
        attn_tp_rank=0,
        attn_dp_size=1,
        attn_dp_rank=0,
        attn_cp_size=cp_size,
        attn_cp_rank=cp_rank,
        moe_ep_size=1,
        moe_ep_rank=0,
        moe_dp_size=1,
        moe_tp_size=cp_size,
    )
