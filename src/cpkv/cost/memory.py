"""What one GPU of a CP group holds (SPEC C-COST; docs/cost-model.md, "Memory"): the KV pool SGLang would
size for the model at the group's CP / EP layout, from aiconfigurator's KV-cache estimator
(``aiconfigurator_core.sdk.memory.KVCacheEstimator``).

SGLang sizes its pool as ``HBM * mem_fraction_static`` less the weights (and, in aiconfigurator's model,
the activations and runtime overheads); the rest of HBM is headroom for activations and CUDA graphs.
``mem_fraction_static`` is SGLang's own default (``sglang/srt/arg_groups/memory_hook.py``, 0.5.23):
``(HBM - reserved) / HBM`` rounded to 3 decimals, ``reserved = 512 + 1.5 * max(chunk, 2048) + tp / 8 *
1024`` MB, at least 10 GiB on a GPU above 60 GiB (the CUDA-graph and DeepEP reserves are left out:
prefill-only CP runs neither). SGLang runs CP inside its TP group (``tp`` = the group's GPUs); attention
weights are on every GPU (as attention data parallelism, the layout the estimator knows), experts spread
over ``ep_size``.
"""

from __future__ import annotations

from functools import lru_cache

from .spec import MeasuredSpec

MIB = 2**20
GIB = 2**30


def sglang_mem_fraction_static(hbm_bytes: float, chunk_size: int, tp_size: int) -> float:
    """SGLang's default ``mem_fraction_static`` on a GPU of ``hbm_bytes`` with chunked prefill of
    ``chunk_size`` tokens in a TP group of ``tp_size`` GPUs (module docstring). Example: H200 (141 GiB),
    8,192-token chunks, 8 GPUs: reserved 13,824 MB, 0.904."""
    hbm_mb = hbm_bytes / MIB
    reserved = 512 + 1.5 * max(chunk_size, 2048) + tp_size / 8 * 1024
    if hbm_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((hbm_mb - reserved) / hbm_mb, 3)


@lru_cache(maxsize=32)
def memory_plan(
    spec: MeasuredSpec, cp_size: int, chunk_size: int, max_batch_tokens: int, max_running: int, page_size: int
) -> dict:
    """The memory of one GPU of the group and the pool it leaves, JSON-ready (bytes unless named).

    Returns ``{"hbm_bytes", "weights_bytes", "activations_bytes", "runtime_overhead_bytes",
    "comm_overhead_bytes", "kv_pool_bytes", "headroom_bytes", "mem_fraction_static",
    "kv_bytes_per_token", "kv_pool_tokens", "pages_per_lane", "sources"}``: the pool is
    ``hbm * mem_fraction_static - (weights + activations + overheads)``, its tokens as the estimator
    converts them (the model's KV bytes per token), ``pages_per_lane = kv_pool_tokens // page_size``;
    ``hbm = weights + activations + overheads + pool + headroom`` exactly. Where the weights and
    activations leave no budget (DeepSeek-V3.2 at EP 4 on an H200) the pool is 0 pages and ``headroom_bytes``
    negative: the model does not fit (``SimConfig.for_workload`` then keeps the hypothetical default pool).

    Raises:
        CostModelError: the estimator cannot size the model (its words).
        CostExtraMissing: aiconfigurator is not installed.
    """
    from .aic import guarded, load_aiconfigurator, measured_database

    load_aiconfigurator()
    from aiconfigurator_core.sdk.memory import KVCacheEstimator

    ep = spec.ep_for(cp_size)
    version, db = measured_database(spec.gpu, spec.backend)
    where = f"the KV pool of {spec.model} on {spec.gpu} ({spec.backend}) at cp_size {cp_size}, ep_size {ep}"
    estimator = guarded(
        where,
        KVCacheEstimator.from_request,
        spec.model,
        spec.gpu,
        spec.backend,
        version,
        max_num_tokens=max_batch_tokens,
        max_batch_size=max_running,
        tp_size=1,
        attention_dp_size=cp_size,
        moe_tp_size=cp_size // ep,
        moe_ep_size=ep,
    )
    hbm = float(db.system_spec["gpu"]["mem_capacity"])
    fraction = sglang_mem_fraction_static(hbm, chunk_size, cp_size)
    b = estimator.breakdown
    parts = {
        k: int(b[k])
        for k in ("weights_bytes", "activations_bytes", "runtime_overhead_bytes", "comm_overhead_bytes")
    }
    pool = max(int(hbm * fraction - b["non_kv_bytes"]), 0)  # aiconfigurator's kv_cache_budget_bytes, of total
    tokens = int(b["tokens_from_kv_bytes"](pool)) if pool else 0
    headroom = int(hbm) - sum(parts.values()) - pool  # negative: the model does not fit
    src_est = f"aiconfigurator {_version()} KVCacheEstimator ({spec.backend} {version})"
    return {
        "hbm_bytes": int(hbm),
        **parts,
        "kv_pool_bytes": pool,
        "headroom_bytes": headroom,
        "mem_fraction_static": fraction,
        "kv_bytes_per_token": int(b["kv_size_per_token_bytes"]),
        "kv_pool_tokens": tokens,
        "pages_per_lane": tokens // page_size,
        "sources": {
            "hbm_bytes": f"aiconfigurator system spec {spec.gpu} (gpu.mem_capacity)",
            "weights_bytes": f"{src_est}: the model's weights per GPU at EP {ep}, attention on every GPU",
            "activations_bytes": f"{src_est}: activations of {max_batch_tokens:,} tokens a step",
            "runtime_overhead_bytes": src_est,
            "comm_overhead_bytes": src_est,
            "mem_fraction_static": "SGLang 0.5.23 default (arg_groups/memory_hook.py): (HBM - reserved) / HBM",
            "kv_pool_bytes": "hbm * mem_fraction_static - weights - activations - overheads (aiconfigurator)",
            "headroom_bytes": "hbm - everything above",
        },
    }


def _version() -> str:
    from .aic import aiconfigurator_version

    return aiconfigurator_version()
