"""The one-pool designs, replicated and interleaved-vblock (SPEC C-STORAGE): each allocates in its own pages
(a replicated page, a virtual block of P tokens per rank) under the group's compute plan."""

import pytest

from cpkv.sim.config import SimConfig

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]


def test_one_pool_designs_allocate_in_their_own_pages(build_design):
    # C=2, P=2: replicated takes pages of 2 tokens from one lane; a virtual block holds 4 tokens (2 per rank),
    # so a 6-token prompt takes 2 blocks; the compute plan is the zigzag of 3 pages over the 2 ranks either way
    cfg = SimConfig(cp_size=2, page_size=2, pages_per_lane=8)
    rep, vb = build_design("replicated", cfg), build_design("interleaved-vblock", cfg)
    a = rep.alloc.alloc_extend([0], [6], [-1])
    assert a.new_pages.tolist() == [1, 2, 3] and a.out_cache_loc_cpu.tolist() == [2, 3, 4, 5, 6, 7]
    b = vb.alloc.alloc_extend([0], [6], [-1])
    assert b.new_pages.tolist() == [1, 2] and b.out_cache_loc_cpu.tolist() == [4, 5, 6, 7, 8, 9]
    for x in (a, b):
        assert x.plan.token_owner.tolist() == [0, 0, 1, 1, 1, 1] and x.plan.per_rank_tokens.tolist() == [2, 4]
    assert b.plan.page_indptr.tolist() == [0, 2] and rep.used_pages_per_rank().tolist() == [3, 3]
    assert vb.used_pages_per_rank().tolist() == [2, 2]  # a block is one physical page on each rank
