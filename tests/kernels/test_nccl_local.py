"""``kv_access = local`` with decode on CUDA (NCCL, one GPU per rank; C = 2 with two GPUs, else 1).

Skipped without CUDA. Not yet run on GPUs (no GPU on the dev machine when it was written).
"""

import pytest
import torch

from cpkv.executor import DistCase, TinyDecoderConfig, make_workload, run_dist

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.clause("C-MERGE"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GPU_TOL = 1e-4  # as test_nccl_smoke: GPU kernels reduce in other orders than the CPU ones


def test_local_access_prefill_and_decode_on_nccl():
    C = min(2, torch.cuda.device_count())
    wl = make_workload([0, 32, 19], [3, 53, 5], chunks=3, seed=7, reuse=True)
    nsa = TinyDecoderConfig(
        kv_lora_rank=48,
        rope_dim=16,
        seed=3,
        attention="nsa",
        index_heads=4,
        index_head_dim=32,
        index_rope_dim=16,
        index_topk=8,
    )
    cases = [
        DistCase(workload=wl, page_size=16, model=m, kv_access="local", decode_steps=2, name=m.attention)
        for m in (TinyDecoderConfig(), nsa)
    ]
    run = run_dist(cases, C, backend="nccl", timeout_s=120, deadline_s=280)
    for res in run.results:
        assert res.kv_buffer == "local" and res.pool_rows["latent"] == max(res.pages_per_lane) * 16
        assert res.max_abs_err <= GPU_TOL, (res.name, res.max_abs_err)
        assert res.tokens_match is True and res.unwritten_rows_intact is True
