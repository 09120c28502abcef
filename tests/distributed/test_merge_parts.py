"""The cross-rank merge (SPEC C-MERGE) in one process: partial softmax and its exact merge, the local and
global top-k of sharded index keys, the logits count under ``local``, own-lane-only KV buffer and the
scheduler's decode lifecycle.

The oracles here are written from the SPEC text: a float64 softmax over the union of the shards, and a
brute-force top-k that sorts positions by (-logit, position).
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import ConfigError, CPConfig, OwnerLaneAllocator, PlanError
from cpkv.executor import (
    DistCase,
    DistError,
    KVBuffer,
    LaneReadError,
    ReplicatedScheduler,
    TinyDecoder,
    TinyDecoderConfig,
    make_workload,
)
from cpkv.executor.kv_buffer import create_kv_buffer, shm_dir
from cpkv.executor.local_attention import local_logits_elements
from cpkv.executor.merge import local_topk, lse_from_base2, merge_partials, merge_topk, shard_softmax
from cpkv.executor.partial import attention_output, attention_queries, dense_partial, sparse_partial
from cpkv.layout import SharedKVLayout

pytestmark = [pytest.mark.distributed, pytest.mark.clause("C-MERGE")]

TOL = 1e-5


def union_attention(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Oracle: float64 softmax over every key of the union, ``scores [n, k]``, ``values [k, d]``."""
    return torch.softmax(scores.double(), dim=-1) @ values.double()


def shard_merge(scores: torch.Tensor, values: torch.Tensor, owner: list[int], C: int):
    """Each shard's partial over the keys it owns (``owner[j]`` = shard of key j), then the merge."""
    outs, lses = [], []
    for r in range(C):
        keys = [j for j, o in enumerate(owner) if o == r]
        probs, lse = shard_softmax(scores[:, keys])
        outs.append(probs @ values[keys])
        lses.append(lse)
    return merge_partials(torch.stack(outs), torch.stack(lses))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 3), st.integers(1, 12), st.integers(1, 5), st.data())
def test_merge_of_two_and_three_shards_is_softmax_over_the_union(C, k, n, data):
    """Any split of the keys over 2 or 3 shards, empty shards included: the merge equals one softmax over
    all keys within 1e-5, and the merged LSE is the log-sum-exp of every score."""
    owner = data.draw(st.lists(st.integers(0, C - 1), min_size=k, max_size=k))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    scores, values = 4 * torch.randn(n, k, generator=g), torch.randn(k, 6, generator=g)
    out, lse = shard_merge(scores, values, owner, C)
    torch.testing.assert_close(out.double(), union_attention(scores, values), rtol=0, atol=TOL)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores.double(), -1), rtol=0, atol=TOL)


def test_the_two_worked_splits_match_the_union():
    """Two shards {0, 2} / {1, 3} and three shards {0} / {1, 2} / {3} of the same 4 keys."""
    scores = torch.tensor([[0.5, -1.0, 2.0, 0.25], [3.0, 3.0, -2.0, 1.0]])
    values = torch.arange(12, dtype=torch.float32).view(4, 3)
    want = union_attention(scores, values)
    for owner, C in (([0, 1, 0, 1], 2), ([0, 1, 1, 2], 3)):
        out, _ = shard_merge(scores, values, owner, C)
        torch.testing.assert_close(out.double(), want, rtol=0, atol=TOL)


def test_an_empty_shard_contributes_nothing_and_never_nan():
    """A shard with no key (k = 0) and a shard whose keys are all masked give LSE -inf and O = 0; the merge
    is then the other shard's result exactly, even if an empty shard's O held NaN."""
    scores, values = torch.tensor([[1.0, 2.0, 0.5]]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    empty_p, empty_lse = shard_softmax(scores[:, :0])
    masked_p, masked_lse = shard_softmax(torch.full((1, 2), float("-inf")))
    assert empty_p.shape == (1, 0) and empty_lse.tolist() == [float("-inf")]
    assert masked_p.tolist() == [[0.0, 0.0]] and masked_lse.tolist() == [float("-inf")]
    probs, lse = shard_softmax(scores)
    full = probs @ values
    nan = torch.full_like(full, float("nan"))
    out, merged = merge_partials(
        torch.stack([nan, full, torch.zeros_like(full)]), torch.stack([empty_lse, lse, masked_lse])
    )
    assert torch.equal(out, full) and torch.equal(merged, lse)
    # No shard saw a key: O = 0, LSE = -inf, no NaN.
    out, merged = merge_partials(torch.zeros(2, 1, 2), torch.full((2, 1), float("-inf")))
    assert out.tolist() == [[0.0, 0.0]] and merged.tolist() == [float("-inf")]


def test_a_shard_holding_every_key():
    g = torch.Generator().manual_seed(3)
    scores, values = torch.randn(4, 9, generator=g), torch.randn(9, 5, generator=g)
    for C in (2, 3, 4):
        for holder in range(C):
            out, _ = shard_merge(scores, values, [holder] * 9, C)
            torch.testing.assert_close(out.double(), union_attention(scores, values), rtol=0, atol=TOL)


def test_base2_lse_is_converted_before_the_merge():
    scores = torch.tensor([[1.0, -0.5, 2.5]])
    lse2 = torch.log2(torch.exp2(scores * math.log2(math.e)).sum(-1))  # a kernel's log2-sum-exp2
    torch.testing.assert_close(lse_from_base2(lse2), torch.logsumexp(scores, -1), rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------- top-k (C-NSA)
def brute_topk(logits: list[float], p: int, k: int) -> list[int]:
    """From the SPEC text: the min(k, p + 1) largest of keys 0..p, ties to the lower position, ascending,
    -1 padded to k."""
    keys = sorted(range(p + 1), key=lambda s: (-logits[s], s))[: min(k, p + 1)]
    return sorted(keys) + [-1] * (k - len(keys))


def sharded_topk(logits: torch.Tensor, q_pos: torch.Tensor, owner: list[int], C: int, k: int, perm=None):
    """Each shard's local top-k over its own keys, the candidates concatenated (in ``perm`` order of the
    shards, columns shuffled by ``perm`` too when given), then the global merge."""
    b = logits.shape[1]
    cands = []
    for r in range(C):
        own = torch.tensor([s for s in range(b) if owner[s] == r], dtype=torch.int64)
        cands.append(local_topk(logits[:, own], own, q_pos, min(k, b)))
    order = list(range(C)) if perm is None else perm.permutation(C).tolist()
    cl = torch.cat([cands[r][0] for r in order], 1)
    cp = torch.cat([cands[r][1] for r in order], 1)
    if perm is not None:
        cols = torch.from_numpy(perm.permutation(cl.shape[1]))
        cl, cp = cl[:, cols], cp[:, cols]
    return merge_topk(cl, cp, q_pos, k)


def test_the_spec_example():
    """C=2, k=2, logits [0.5, 0.9, 0.9, 0.1]; positions 0, 2 on rank 0 and 1, 3 on rank 1."""
    logits, q = torch.tensor([[0.5, 0.9, 0.9, 0.1]]), torch.tensor([3])
    l0, p0 = local_topk(logits[:, [0, 2]], torch.tensor([0, 2]), q, 2)
    l1, p1 = local_topk(logits[:, [1, 3]], torch.tensor([1, 3]), q, 2)
    assert p0.tolist() == [[2, 0]] and torch.equal(l0, logits[:, [2, 0]])
    assert p1.tolist() == [[1, 3]] and torch.equal(l1, logits[:, [1, 3]])
    assert merge_topk(torch.cat([l0, l1], 1), torch.cat([p0, p1], 1), q, 2).tolist() == [[1, 2]]


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 4), st.integers(1, 14), st.integers(1, 10), st.data())
def test_sharded_topk_is_the_global_rule_with_many_ties(C, b, k, data):
    """Small integer logits (many ties), keys on random shards (some empty), random causal query rows:
    local top-k per shard then the merge equals the brute-force global rule; and 20 runs that shuffle the
    shards' order and the candidate columns give the same rows, bit for bit."""
    rows = data.draw(st.lists(st.lists(st.integers(-2, 2), min_size=b, max_size=b), min_size=1, max_size=5))
    q_pos = torch.tensor([data.draw(st.integers(0, b - 1)) for _ in rows])
    owner = data.draw(st.lists(st.integers(0, C - 1), min_size=b, max_size=b))
    logits = torch.tensor(rows, dtype=torch.float32)
    got = sharded_topk(logits, q_pos, owner, C, k)
    assert got.tolist() == [brute_topk(r, int(p), k) for r, p in zip(rows, q_pos, strict=True)]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    for _ in range(20):
        assert torch.equal(sharded_topk(logits, q_pos, owner, C, k, perm=rng), got)


def test_merge_refuses_too_few_candidates():
    with pytest.raises(DistError, match="query at position 3 has 1 candidates, needs 2"):
        merge_topk(torch.tensor([[1.0, float("-inf")]]), torch.tensor([[0, -1]]), torch.tensor([3]), 2)


# ----------------------------------------------------------------------------- partials of the model
@pytest.mark.parametrize("kv_mode", ["mla", "mha"])
def test_dense_partials_merge_to_the_model_attention(kv_mode):
    """Keys of one request spread over 3 lanes (one holding none of the first queries' keys): the merged
    partials, projected, equal ``TinyDecoder.attention`` over every key."""
    m = TinyDecoder(
        TinyDecoderConfig(kv_mode=kv_mode, kv_lora_rank=32, rope_dim=8, hidden_size=32, mlp_size=64)
    )
    g = torch.Generator().manual_seed(0)
    x, pos = torch.randn(10, 32, generator=g), torch.arange(10)
    rows = m.kv_rows(0, x, pos)
    q = attention_queries(m, 0, x, pos)
    owner = torch.tensor([0, 0, 1, 1, 0, 2, 2, 1, 0, 2])
    parts = [dense_partial(m, q, pos, rows[owner == r], pos[owner == r]) for r in range(3)]
    merged, _ = merge_partials(
        torch.stack([p[..., :-1] for p in parts]), torch.stack([p[..., -1] for p in parts])
    )
    assert parts[2][0, :, -1].isneginf().all()  # lane 2 holds no key query 0 may see
    torch.testing.assert_close(
        attention_output(m, 0, merged), m.attention(0, x, pos, rows, pos), rtol=0, atol=TOL
    )


def test_sparse_partials_merge_to_sparse_mla():
    m = TinyDecoder(
        TinyDecoderConfig(
            kv_lora_rank=32,
            rope_dim=8,
            hidden_size=32,
            mlp_size=64,
            attention="nsa",
            index_heads=2,
            index_head_dim=16,
            index_rope_dim=8,
        )
    )
    g = torch.Generator().manual_seed(1)
    x, pos = torch.randn(6, 32, generator=g), torch.arange(6)
    rows = m.kv_rows(0, x, pos)
    topk = torch.tensor([[0, -1, -1], [0, 1, -1], [0, 2, -1], [1, 2, 3], [0, 3, 4], [2, 4, 5]])
    lane = torch.tensor([0, 1, 1, 0, 1, 0])
    parts = []
    for r in range(2):
        held = (topk >= 0) & (lane[topk.clamp(min=0)] == r)
        parts.append(sparse_partial(m, attention_queries(m, 0, x, pos), topk, held, rows.__getitem__))
    merged, _ = merge_partials(
        torch.stack([p[..., :-1] for p in parts]), torch.stack([p[..., -1] for p in parts])
    )
    want = m.sparse_attention(0, x, pos, topk, rows.__getitem__)
    torch.testing.assert_close(attention_output(m, 0, merged), want, rtol=0, atol=TOL)


# ------------------------------------------------------------------------ logits count under local
@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),
    st.sampled_from([1, 4, 16]),
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), min_size=1, max_size=3),
    st.data(),
)
def test_local_logits_elements_formula(C, P, reqs, data):
    """``local_logits_elements`` on a real allocation (prefix pages on the lanes a first extend chose) equals
    the oracle written from docs/distributed.md, and sums to C-ESTIMATE's total over the ranks."""
    policy = data.draw(st.sampled_from(["rotation", "legacy", "balanced"]))
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy), 256)
    L0 = [r[0] for r in reqs]
    first = alloc.alloc_extend([0] * len(reqs), L0, [-1] * len(reqs)) if sum(L0) else None
    pre = [
        first.out_cache_loc[sum(L0[:i]) : sum(L0[: i + 1])] if first else torch.zeros(0, dtype=torch.int64)
        for i in range(len(reqs))
    ]
    last = [int(p[-1]) if p.numel() else -1 for p in pre]
    E = [r[1] for r in reqs]
    a = alloc.alloc_extend(L0, E, last)
    ind = a.plan.extend_indptr
    slots = tuple(torch.cat([pre[i], a.out_cache_loc[ind[i] : ind[i + 1]]]) for i in range(len(reqs)))
    lanes = [((s[::P] // P) % C).tolist() for s in slots]
    got = local_logits_elements(a.plan, slots, C, P)
    h = [int(x) for x in a.plan.head_owners]
    want = oracle.local_mqa_logits_elements(
        L0, E, C, P, lanes, head_owners=h, phases=a.plan.request_phases.tolist()
    )
    assert got.tolist() == want
    assert sum(want) == sum(
        oracle.mqa_logits_elements(L0, E, C, P, head_owners=h, phases=a.plan.request_phases.tolist())
    )


# ------------------------------------------------------------------------------- own-lane-only buffer
def test_local_kv_buffer_holds_and_reads_only_the_own_lane():
    """SPEC example geometry C=4, P=64, Q=8: a local buffer of rank 3 has one lane's rows (Q*P = 512);
    slot 197 (lane 3) writes and reads at row 5; a slot of another lane is refused both ways."""
    layout = SharedKVLayout(4, 64, 8)
    kv = KVBuffer(layout, 3, torch.full((2, layout.lane_slots, 3), float("nan")), "local")
    assert kv.storage.shape == (2, 512, 3) and kv.lane_rows() == (0, 512) and not kv.holds_every_lane
    row = torch.tensor([[1.0, 2.0, 3.0]])
    kv.write(1, torch.tensor([197]), row)
    assert torch.equal(kv.storage[1, 5], row[0]) and torch.equal(kv.read(1, torch.tensor([197])), row)
    with pytest.raises(LaneReadError, match="rank 3 asked to read slot 128 of lane 2"):
        kv.read(0, torch.tensor([197, 128]))
    assert kv.held_rows(torch.tensor([197, 128, 64])).tolist() == [5]


def test_scheduler_holds_prompts_for_decode_then_releases_every_page():
    """With ``hold_prompts`` a finished prompt stays allocated; decode steps take one ``alloc_decode`` slot
    each (a new page only at a page start); ``release`` returns every page that is not in the cache."""
    wl = make_workload([0, 5], [7, 3], chunks=2, seed=0)
    s = ReplicatedScheduler(CPConfig(2, 4, "rotation"), 12, wl, hold_prompts=True)
    done = []
    for f in range(len(wl.forwards)):
        s.finish(s.schedule(f))
        done += s.take_prompt_done()
    assert done == [0, 1] and s.take_prompt_done() == []
    rows = {rid: s.req_to_token[rid].copy() for rid in done}
    for j in range(3):
        b = s.schedule_decode(10 + j, done, [7, 8])
        assert b.positions.tolist() == [7 + j, 8 + j] and b.token_ids.tolist() == [7, 8]
        assert [int(t[-1]) for t in b.kv_slots] == b.out_cache_loc.tolist()
    assert s.generated == {0: [7, 7, 7], 1: [8, 8, 8]}
    # Request 0 (7 tokens) continues its last page at position 7, then starts a page at 8.
    assert s.req_to_token[0][7] == rows[0][6] + 1 and s.req_to_token[0][8] % 4 == 0
    with pytest.raises(PlanError, match="request 5 is not a held request"):
        s.schedule_decode(13, [5], [1])
    for rid in done:
        s.release(rid)
    assert s.req_to_token == {}
    assert int(s.allocator.used_pages_per_lane().sum()) == s.cache.total_cached_pages


class _Group:
    """Stand-in for ``RankGroup`` in ``create_kv_buffer`` (no collective is made for ``local``)."""

    world_size, rank, device = 4, 2, torch.device("cpu")


def test_local_kv_buffer_maps_no_file_and_holds_one_lane():
    """``kind="local"``: no shared file is created (nothing named for the tag appears), the buffer is this
    rank's lane only, NaN-guarded."""
    before = set(shm_dir().iterdir())
    kv = create_kv_buffer(_Group(), SharedKVLayout(4, 16, 8), 2, 8, kind="local", tag="i27-local-test")  # type: ignore[arg-type]
    assert set(shm_dir().iterdir()) - before == set()
    assert kv.kind == "local" and kv.storage.shape == (2, 8 * 16, 8) and kv.storage.isnan().all()


def test_access_and_kv_buffer_must_fit():
    wl = make_workload([0], [10])
    cpu = torch.device("cpu")
    assert DistCase(workload=wl, kv_access="local").resolved_kv_buffer(cpu) == "local"
    assert DistCase(workload=wl).resolved_kv_buffer(cpu) == "shm"
    assert DistCase(workload=wl).resolved_kv_buffer(cpu, single_host=False) == "mirrored"
    for kw, msg in [
        ({"kv_access": "remote"}, "kv_access='remote' unknown; use one of shared, local"),
        ({"kv_access": "local", "kv_buffer": "shm"}, "kv_buffer='shm' is a view of every lane"),
        ({"kv_buffer": "local"}, "kv_buffer='local' needs kv_access='local'"),
        ({"decode_steps": -1}, "decode_steps must be >= 0, got -1"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            DistCase(workload=wl, **kw).resolved_kv_buffer(cpu)
    # The default pool holds every request with its decode tokens: ceil((10 + 7) / 4) + 1 pages per lane.
    assert DistCase(workload=wl, page_size=4, decode_steps=7).resolved_pages_per_lane(2) == [6, 6]
