"""The SPEC's worked examples, checked against the independent oracle (tests/oracle.py).

These pin the oracle itself to the SPEC text, with the arithmetic in comments, so that the property tests
that compare production with the oracle compare against something known to be right.
"""

import pytest

import oracle

pytestmark = pytest.mark.unit


@pytest.mark.clause("C-ZIGZAG")
def test_fresh_request_phase0():
    # C=4, P=64, L0=0, E=1000, i=0: phase = (0 // 64 + 0) % 4 = 0.
    # m = ceil(1000/64) - 0 = 16 pages; 2C = 8 segments of 16 // 8 = 2 pages each (16 % 8 = 0 extra).
    # z(s) = 0,1,2,3,3,2,1,0 -> owners [0,0,1,1,2,2,3,3,3,3,2,2,1,1,0,0].
    # Pages 0..14 are full (15 * 64 = 960 tokens), page 15 holds 1000 - 960 = 40 tokens.
    # rank 0: pages 0, 1, 14 full + page 15 partial = 3 * 64 + 40 = 232; ranks 1..3: 4 * 64 = 256.
    plan = oracle.plan_request(0, 1000, cp_size=4, page_size=64, req_index=0)
    assert plan["phase"] == 0
    assert plan["head_tokens"] == 0
    assert plan["page_owners"] == [0, 0, 1, 1, 2, 2, 3, 3, 3, 3, 2, 2, 1, 1, 0, 0]
    assert plan["per_rank_tokens"] == [232, 256, 256, 256]
    assert plan["last_token_owner"] == 0
    assert len(plan["token_owner"]) == 1000
    assert plan["token_owner"][:64] == [0] * 64
    assert plan["token_owner"][128:192] == [1] * 64


@pytest.mark.clause("C-PHASE")
def test_fresh_request_second_in_batch_is_rotated():
    # Same request at i=1: phase = (0 + 1) % 4 = 1, so every owner is shifted by one lane:
    # [0,0,1,1,2,2,3,3,3,3,2,2,1,1,0,0] + 1 mod 4 = [1,1,2,2,3,3,0,0,0,0,3,3,2,2,1,1];
    # the short rank (the one with the 40-token last page) is now rank 1.
    plan = oracle.plan_request(0, 1000, cp_size=4, page_size=64, req_index=1)
    assert plan["phase"] == 1
    assert plan["page_owners"] == [1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 3, 3, 2, 2, 1, 1]
    assert plan["per_rank_tokens"] == [256, 232, 256, 256]
    assert plan["last_token_owner"] == 1


@pytest.mark.clause("C-HEAD")
def test_unaligned_prefix_with_head_owner():
    # C=4, P=64, L0=100, E=200, head owner 1: phase = (100 // 64 + 0) % 4 = 1.
    # L0 % P = 36, so h = min(200, 64 - 36) = 28 head tokens (positions 100..127) go to the head owner 1.
    # first_new = ceil(100/64) = 2, end = ceil(300/64) = 5, m = 3 pages; 3 // 8 = 0, 3 % 8 = 3, so segments
    # 0, 1, 2 hold one page each: owners (z + phase) % 4 = (0+1, 1+1, 2+1) = [1, 2, 3].
    # Tokens: page 2 = positions 128..191 (64, rank 1), page 3 = 192..255 (64, rank 2),
    # page 4 = 256..299 (44, rank 3). per_rank = [0, 28 + 64, 64, 44] = [0, 92, 64, 44].
    plan = oracle.plan_request(100, 200, cp_size=4, page_size=64, head_owner=1)
    assert plan["phase"] == 1
    assert plan["head_tokens"] == 28
    assert plan["page_owners"] == [1, 2, 3]
    assert plan["per_rank_tokens"] == [0, 92, 64, 44]
    assert plan["token_owner"][:28] == [1] * 28
    assert plan["last_token_owner"] == 3


@pytest.mark.clause("C-HEAD")
def test_head_tokens_without_head_owner_is_refused():
    with pytest.raises(oracle.OracleError):
        oracle.plan_request(100, 5, cp_size=4, page_size=64)
    # No extend token, or an aligned prefix: no head tokens, so no head owner is needed.
    assert oracle.plan_request(100, 0, cp_size=4, page_size=64)["head_tokens"] == 0
    assert oracle.plan_request(128, 5, cp_size=4, page_size=64)["head_tokens"] == 0


@pytest.mark.clause("C-ZIGZAG")
def test_page_size_one_uneven_segments():
    # C=2, P=1, L0=0, E=5: m = 5 pages, 2C = 4 segments: 5 // 4 = 1 each, the first 5 % 4 = 1 gets one more:
    # sizes [2, 1, 1, 1]; z = 0, 1, 1, 0 -> owners [0, 0, 1, 1, 0]; per_rank [3, 2].
    plan = oracle.plan_request(0, 5, cp_size=2, page_size=1)
    assert oracle.segment_sizes(5, 2) == [2, 1, 1, 1]
    assert plan["page_owners"] == [0, 0, 1, 1, 0]
    assert plan["token_owner"] == [0, 0, 1, 1, 0]
    assert plan["per_rank_tokens"] == [3, 2]


@pytest.mark.clause("C-ROTATION-SPREADS")
@pytest.mark.parametrize(("policy", "expected"), [("rotation", [5] * 8), ("legacy", [40] + [0] * 7)])
def test_rotation_spreads_successive_chunks(policy, expected):
    # C=8, P=64: chunk k has L0 = 64k, E = 64, one new page in segment 0 (z = 0), owner = phase.
    # rotation: phase = (k + 0) % 8 -> lanes 0..7 repeated 5 times over 40 chunks -> 5 pages each.
    # legacy: phase 0 -> all 40 pages on lane 0.
    lanes = [0] * 8
    for k in range(40):
        plan = oracle.plan_request(64 * k, 64, cp_size=8, page_size=64, policy=policy)
        assert len(plan["page_owners"]) == 1
        lanes[plan["page_owners"][0]] += 1
    assert lanes == expected


@pytest.mark.clause("C-ROTATION-SPREADS")
@pytest.mark.parametrize(("policy", "expected"), [("rotation", list(range(8))), ("legacy", [0] * 8)])
def test_rotation_spreads_fresh_batch(policy, expected):
    # 8 fresh one-page requests: phase = (0 + i) % 8 = i under rotation -> request i on lane i.
    batch = oracle.plan_batch([0] * 8, [64] * 8, cp_size=8, page_size=64, policy=policy)
    assert batch["page_owners"] == expected
    assert batch["request_phases"] == (list(range(8)) if policy == "rotation" else [0] * 8)


@pytest.mark.clause("C-BATCH")
def test_batch_flattens_in_request_order():
    # Request 0: L0=0, E=5, C=2, P=1 -> owners [0,0,1,1,0] (see above).
    # Request 1: L0=0, E=0 -> nothing.
    # Request 2: L0=0, E=2, phase = (0 + 2) % 2 = 0: m = 2, sizes [1,1,0,0] -> owners [0, 1].
    batch = oracle.plan_batch([0, 0, 0], [5, 0, 2], cp_size=2, page_size=1)
    assert batch["token_owner"] == [0, 0, 1, 1, 0, 0, 1]
    assert batch["per_rank_tokens"] == [4, 3]
    assert batch["last_token_owner"] == [0, -1, 1]
    assert batch["max_rank_tokens"] == 4
    # rank 0's flat tokens 0,1,4,5 get rows 0..3; rank 1's flat tokens 2,3,6 get rows 4+0, 4+1, 4+2.
    assert batch["gather_index"] == [0, 1, 4, 5, 2, 3, 6]


@pytest.mark.clause("C-ESTIMATE")
def test_estimate_page_size_one():
    # C=2, P=1, L0=0, E=5, owners [0,0,1,1,0].
    # merged runs: rank 0 [0,2) -> 2*2 = 4 and [4,5) -> 1*5 = 5, total 9; rank 1 [2,4) -> 2*4 = 8.
    # per segment (sizes [2,1,1,1]): rank 0 [0,2) 4 + [4,5) 5 = 9; rank 1 [2,3) 1*3 + [3,4) 1*4 = 7.
    assert oracle.mqa_logits_elements([0], [5], 2, 1) == [9, 8]
    assert oracle.mqa_logits_elements_per_segment([0], [5], 2, 1) == [9, 7]


@pytest.mark.clause("C-ESTIMATE")
def test_estimate_with_head_run():
    # C=4, P=64, L0=100, E=200, head owner 1 (plan above).
    # rank 1: head [100,128) and page 2 [128,192) merge into [100,192): 92 * 192 = 17664;
    #   per segment: 28 * 128 + 64 * 192 = 3584 + 12288 = 15872.
    # rank 2: [192,256): 64 * 256 = 16384. rank 3: [256,300): 44 * 300 = 13200. rank 0: nothing.
    assert oracle.mqa_logits_elements([100], [200], 4, 64, head_owners=[1]) == [0, 17664, 16384, 13200]
    per_segment = oracle.mqa_logits_elements_per_segment([100], [200], 4, 64, head_owners=[1])
    assert per_segment == [0, 15872, 16384, 13200]


@pytest.mark.clause("C-LAYOUT")
def test_layout_example():
    # C=4, P=64, Q=8. Slot 197: page 3, offset 5 -> read ((3 % 4) * 8 + 3 // 4) * 64 + 5 = 24 * 64 + 5 = 1541,
    # write (3 // 4) * 64 + 5 = 5. Slot 512: page 8 -> read (0 * 8 + 2) * 64 = 128, write (8 // 4) * 64 = 128.
    # Slot 128: page 2 -> lane 2, read (2 * 8 + 0) * 64 = 1024, write 0, owned by rank 2.
    slots = [0, 63, 64, 65, 128, 197, 512, -1]
    assert [oracle.read_slot(s, 4, 64, 8) for s in slots] == [0, 63, 512, 513, 1024, 1541, 128, -1]
    assert [oracle.write_slot(s, 4, 64) for s in slots] == [0, 63, 0, 1, 0, 5, 128, -1]
    F, T = False, True
    assert [oracle.owned(s, 2, 4, 64) for s in slots] == [F, F, F, F, T, F, F, F]
    assert [oracle.lane_of(s, 4, 64) for s in slots] == [0, 0, 1, 1, 2, 3, 0, -1]


@pytest.mark.clause("C-ALLOC")
def test_alloc_example_fresh_allocator():
    # C=4, P=64, Q=8, fresh: lane r holds pages r, r+4, r+8, ... (page 0 reserved).
    # owners [0,0,1,1,2,2,3,3,3,3,2,2,1,1,0,0] take lane 0: 4, 8; lane 1: 1, 5; lane 2: 2, 6; lane 3: 3, 7, 11, 15;
    # lane 2: 10, 14; lane 1: 9, 13; lane 0: 12, 16.
    owners = oracle.plan_request(0, 1000, 4, 64)["page_owners"]
    pages = oracle.fresh_alloc_pages(owners, cp_size=4, pages_per_lane=8)
    assert pages == [4, 8, 1, 5, 2, 6, 3, 7, 11, 15, 10, 14, 9, 13, 12, 16]
    loc = oracle.out_cache_loc(0, 1000, -1, pages, 64)
    # page 4 -> 256..319, page 8 -> 512..575, page 1 -> 64..127; last page 16 holds 40 tokens: 1024..1063.
    assert loc[:192] == list(range(256, 320)) + list(range(512, 576)) + list(range(64, 128))
    assert loc[-40:] == list(range(1024, 1064))
    assert len(set(loc)) == 1000


@pytest.mark.clause("C-HEAD")
def test_out_cache_loc_with_head():
    # L0=100, P=64: last_loc is the slot of position 99; put it in page 2 at offset 99 % 64 = 35 -> 163.
    # h = 28 head slots 164..191; new pages [5, 6, 7] -> 320..383, 384..447, 448..491 (44 tokens).
    loc = oracle.out_cache_loc(100, 200, 163, [5, 6, 7], 64)
    assert loc == [*range(164, 192), *range(320, 384), *range(384, 448), *range(448, 492)]
    with pytest.raises(oracle.OracleError):
        oracle.out_cache_loc(100, 200, 163, [5, 6], 64)
