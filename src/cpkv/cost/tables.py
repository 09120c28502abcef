"""The price tables of one CP group, sampled from aiconfigurator (``aic.price_tables``; SPEC C-COST).

Every latency is the whole model's (all layers) in milliseconds, as aiconfigurator reports an operator
(its per-layer time times the layers that run it). Sizes are tokens unless named otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .comm import CommCost
from .grid import Curve, Surface


@dataclass(frozen=True, eq=False)
class PriceTables:
    """Measured prices of one group of ``cp_size`` GPUs (SPEC C-COST).

    Attributes:
        cp_size, ep_size, moe_tp_size: the group and its MoE parallel widths (``ep * moe_tp == cp_size``).
        num_layers, hidden_size: of the model. index_topk: keys the sparse attention selects per query.
        kv_row_bytes: KV bytes of one token in one layer: latent ``(kv_lora_rank + rope) x 2`` (bf16) plus
            index key ``index_head_dim`` bytes (fp8) and its fp32 scale (1284 for DeepSeek-V3.2; C-STORAGE).
        kv_gather_row_bytes: bytes of one token's row in one layer of the KV all-gathers of the replicated and
            interleaved designs, as SGLang moves them: latent ``(kv_lora_rank + rope) x 2`` plus the index key
            in bf16, ``index_head_dim x 2`` (1408 for DeepSeek-V3.2; aiconfigurator's
            docs/CONTEXT_PARALLEL_DSA_MODELING.md section 3.4, instrumenting SGLang).
        attention: context DSA module (projections, indexer, top-k, sparse MLA, o_proj) of one run of
            ``s`` queries after ``p`` earlier keys, ``(s, p) -> ms``.
        per_token: a rank's embedding and norms over its ``n`` tokens.
        group: the MoE block over the group's ``T`` tokens (shared expert, router, routed experts spread
            over ``ep_size`` GPUs), the same on every rank.
        dispatch: the MoE's all-gather and reduce-scatter of hidden states over ``rows`` gathered rows.
        logits: the LM head over ``rows`` rows (one per request).
        gen_attention: generation DSA module of ``b`` decode tokens over ``L`` keys each, ``(b, L) -> ms``.
        gen_per_token: embedding and norms of ``b`` decode tokens. gen_group: the decode MoE block of the
            group's ``b`` decode tokens (routed experts and dispatch overlapped with the shared expert).
        gen_logits: the LM head over ``b`` decode tokens.
        indexer_ms_per_element: the measured module's cost per MQA-logits element (one query, one key) at
            long contexts, used only to split a run's attention time into indexer and the rest.
        comm: collective prices of the system (``CommCost``).
        provenance: JSON-ready dict naming the cost model, GPU, model, engine and versions (report.json).
    """

    cp_size: int
    ep_size: int
    moe_tp_size: int
    num_layers: int
    hidden_size: int
    index_topk: int
    kv_row_bytes: int
    attention: Surface
    per_token: Curve
    group: Curve
    dispatch: Curve
    logits: Curve
    gen_attention: Surface
    gen_per_token: Curve
    gen_group: Curve
    gen_logits: Curve
    indexer_ms_per_element: float
    comm: CommCost
    provenance: dict = field(default_factory=dict)
    kv_gather_row_bytes: int = 1408
