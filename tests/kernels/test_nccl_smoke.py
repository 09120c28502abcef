"""The CP reference forward on NCCL (one GPU per rank, mirrored KV buffer). Skipped without 2 GPUs."""

import pytest
import torch

from cpkv.executor import DistCase, TinyDecoderConfig, make_workload, run_dist

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices for a 2-rank NCCL group"),
]

# GPU kernels reduce in other orders than the CPU ones; 1e-4 still catches any wrong slot or index.
GPU_TOL = 1e-4


@pytest.mark.clause("C-GATHER")
@pytest.mark.clause("C-LAYOUT")
def test_nccl_forward_matches_reference():
    wl = make_workload([0, 32, 19], [3, 53, 5], chunks=3, seed=7, reuse=True)
    cases = [
        DistCase(workload=wl, page_size=P, policy=pol, audit_writes=True, name=f"P{P}-{pol}")
        for P in (1, 16)
        for pol in ("rotation", "balanced")
    ]
    cases.append(DistCase(workload=wl, page_size=16, model=TinyDecoderConfig(kv_mode="mha"), name="mha"))
    run = run_dist(cases, 2, backend="nccl", timeout_s=120, deadline_s=280)
    for res in run.results:
        assert res.kv_buffer == "mirrored"
        assert res.max_abs_err <= GPU_TOL, (res.name, res.max_abs_err)
        assert res.unwritten_rows_intact is True
    for outcome in run.outcomes:
        for res in outcome.result:
            assert all(
                (a.rows_outside_lane, a.rows_unexpected, a.rows_misread) == (0, 0, 0) for a in res.audits
            )
