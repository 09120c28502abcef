"""``cpkv.integrations.sglang_cp`` without SGLang (it imports none): the worked example of docs/sglang.md,
the split and rerange on it, and the typed errors. The differential tests against SGLang's own code are in
tests/integration/sglang/ (0.5.23) and tests/integration/sglang059/ (0.5.9), run by ``make test-sglang``.
"""

import numpy as np
import pytest
import torch

from cpkv import ConfigError, CPConfig, PlanError, UnsupportedPagePlan, plan_batch
from cpkv.integrations import sglang_cp

pytestmark = pytest.mark.unit


def docs_example():
    """docs/sglang.md: C = 4, P = 16, rotation; request 0 L0=0, E=200 (phase 0), request 1 L0=64, E=96 (phase 1)."""
    return plan_batch([0, 64], [200, 96], CPConfig(4, 16, "rotation"))


@pytest.mark.clause("C-PHASE")
@pytest.mark.clause("C-ZIGZAG")
def test_docs_worked_example_per_rank():
    plan = docs_example()
    assert plan.request_phases.tolist() == [0, 1]
    split = [32, 32, 32, 32, 32, 16, 16, 8, 16, 16, 16, 16, 16, 16, 0, 0]
    want = {  # rank: zigzag_index, kv_len_prev_list, kv_len_next_list, actual_seq_q_prev_list, actual_seq_q_next_list
        0: ([0, 11, 7, 12], [32, 128], [200, 144], [32, 16], [8, 16]),
        1: ([1, 8, 6, 15], [64, 80], [192, 160], [32, 16], [16, 0]),
        2: ([2, 9, 5, 14], [96, 96], [176, 160], [32, 16], [16, 0]),
        3: ([3, 10, 4, 13], [128, 112], [160, 160], [32, 16], [32, 16]),
    }
    for r, (zigzag_index, kv_prev, kv_next, q_prev, q_next) in want.items():
        m = sglang_cp.zigzag_metadata(plan, r)
        assert (m.total_seq_lens, m.bs, m.split_list, m.request_phases) == (296, 2, split, [0, 1])
        assert m.cp_reverse_index == [0, 4, 8, 12, 14, 10, 6, 2, 5, 9, 13, 1, 3, 15, 11, 7]
        assert m.reverse_split_len == [32, 16, 8, 16, 32, 16, 16, 0, 32, 16, 16, 0, 32, 16, 32, 16]
        assert m.per_rank_actual_token == [72, 64, 64, 96] and m.max_rank_len == [96] * 4
        assert (m.zigzag_index, m.kv_len_prev_list, m.kv_len_next_list) == (zigzag_index, kv_prev, kv_next)
        assert (m.actual_seq_q_prev_list, m.actual_seq_q_next_list) == (q_prev, q_next)
        assert m.kv_len_prev_tensor.dtype == torch.int32 and m.kv_len_prev_tensor.tolist() == kv_prev
        assert m.cu_seqlens_q_combined_tensor.tolist() == [0, *np.cumsum(q_prev + q_next).tolist()]
        assert (m.total_q_prev_tokens, m.total_q_next_tokens) == (sum(q_prev), sum(q_next))


@pytest.mark.clause("C-GATHER")
@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
def test_docs_example_split_and_rerange_round_trip():
    """Each rank's rows are the tokens it owns (prev blocks first); the all-gather buffer of 4 x 96 rows,
    reranged, is the batch in flat order; ``ceil(296 / 4) = 74`` rows a rank would not hold rank 3's 96."""
    plan = docs_example()
    x = torch.arange(296 * 2).reshape(296, 2)
    metas = [sglang_cp.zigzag_metadata(plan, r) for r in range(4)]
    shards = []
    for r, m in enumerate(metas):
        idx = sglang_cp.local_token_index(m)
        assert np.array_equal(np.sort(idx), np.flatnonzero(plan.token_owner == r))
        shards.append(sglang_cp.shard_hidden_states(x, m))
        assert torch.equal(shards[-1], x[torch.from_numpy(idx)])
        assert torch.equal(
            sglang_cp.shard_position_ids(torch.arange(296)[None].expand(3, -1), m)[1], torch.from_numpy(idx)
        )
    assert sglang_cp.local_token_index(metas[1])[:4].tolist() == [32, 33, 34, 35]  # request 0, block 1 first
    buffer = torch.cat([torch.cat([s, s.new_zeros(96 - len(s), 2)]) for s in shards])
    assert torch.equal(sglang_cp.gather_rerange(buffer, metas[0]), x)
    with pytest.raises(PlanError, match="4 \\* 96 = 384 rows, got shape \\[296, 2\\]"):
        sglang_cp.gather_rerange(buffer[:296], metas[0])


@pytest.mark.clause("C-GATHER")
def test_one_request_nsa_metadata_and_its_rerange_is_the_gather_index():
    """SGLang 0.5.9's fields for C=2, P=1, L0=0, E=5 (docstring example); the rerange is ``gather_index``."""
    plan = plan_batch([0], [5], CPConfig(2, 1, "legacy"))
    m = sglang_cp.nsa_metadata(plan, 1)
    assert (m.split_list, m.zigzag_index, m.per_rank_actual_token, m.max_rank_len) == (
        [2, 1, 1, 1],
        [1, 2],
        [3, 2],
        [3, 3],
    )
    assert (m.reverse_split_len, m.cp_reverse_index) == ([2, 1, 1, 1], [0, 2, 3, 1])
    assert (m.kv_len_prev, m.kv_len_next, m.actual_seq_q_prev, m.actual_seq_q_next) == (3, 4, 1, 1)
    assert (
        m.kv_len_next_tensor.dtype == torch.int32
        and m.kv_len_next_tensor.shape == ()
        and int(m.kv_len_next_tensor) == 4
    )
    assert m.total_seq_lens.dtype == torch.int64 and int(m.total_seq_lens) == 5 and m.request_phases == [0]
    assert sglang_cp.rerange_index(m).tolist() == plan.gather_index.tolist() == [0, 1, 3, 4, 2]
    rotated = sglang_cp.nsa_metadata(plan_batch([0], [5], CPConfig(2, 1, "rotation"), phases=[1]), 0)
    assert (rotated.zigzag_index, rotated.kv_len_prev, rotated.per_rank_actual_token) == ([1, 2], 3, [2, 3])


def test_plans_sglangs_layout_cannot_hold_are_typed_errors():
    config = CPConfig(2, 4, "rotation")
    with pytest.raises(UnsupportedPagePlan, match="request 1: prefix_len=6 ends inside a page .* rank 1"):
        sglang_cp.zigzag_metadata(plan_batch([0, 6], [8, 9], config, head_owners=[None, 1]), 0)
    plan = plan_batch([0, 0], [8, 8], config)
    with pytest.raises(PlanError, match="for one request, the plan has 2; use zigzag_metadata"):
        sglang_cp.nsa_metadata(plan, 0)
    with pytest.raises(ConfigError, match="rank=2 out of range \\[0, 2\\)"):
        sglang_cp.zigzag_metadata(plan, 2)
    with pytest.raises(PlanError, match="plan must be a BatchPlan, got RequestPlan"):
        sglang_cp.zigzag_metadata(plan.requests[0], 0)
    with pytest.raises(
        PlanError, match="request 0: prefix_len \\+ extend_len = 2147483652 is above SGLang's int32"
    ):
        sglang_cp.zigzag_metadata(plan_batch([2**31], [4], config), 0)
    interleave = plan_batch([0], [40], CPConfig(4, 4, "rotation", "interleave"))  # was a bare IndexError
    for build in (sglang_cp.zigzag_metadata, sglang_cp.nsa_metadata):
        with pytest.raises(
            UnsupportedPagePlan, match="the plan's cp_strategy is 'interleave'.*interleave_metadata"
        ):
            build(interleave, 0)
    near = 2**31 - 64  # each request fits int32, the running sums over the batch do not
    with pytest.raises(PlanError, match="cu_seqlens_kv_prev holds 4294967200, above SGLang's int32"):
        sglang_cp.zigzag_metadata(plan_batch([near, near], [32, 32], CPConfig(2, 16, "legacy")), 0)
