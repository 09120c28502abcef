"""The NSA parts of the executor in one process: indexer arithmetic, top-k rules, sparse MLA, the rank's
runs of positions, host-tier hooks over both pools, and the configuration errors (SPEC C-NSA)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv import ConfigError, CPConfig, plan_batch
from cpkv.executor import (
    DistCase,
    DistError,
    KVBuffer,
    TinyDecoder,
    TinyDecoderConfig,
    host_hooks,
    make_workload,
)
from cpkv.executor.indexer import index_logits, mask_causal, near_ties, select_topk, sparse_mla
from cpkv.executor.kv_buffer import create_kv_buffer
from cpkv.executor.nsa import rank_runs
from cpkv.layout import SharedKVLayout

pytestmark = pytest.mark.distributed

SMALL_NSA = dict(
    kv_lora_rank=32,
    rope_dim=8,
    hidden_size=32,
    mlp_size=64,
    attention="nsa",
    index_heads=3,
    index_head_dim=16,
    index_rope_dim=8,
)


def brute_topk(logits: list[list[float]], positions: list[int], k: int) -> list[list[int]]:
    """Written from the SPEC text: the min(k, p + 1) largest of keys 0..p, ties to the lower position,
    ascending, -1 padded to k."""
    out = []
    for row, p in zip(logits, positions, strict=True):
        keys = sorted(range(p + 1), key=lambda s: (-row[s], s))[: min(k, p + 1)]
        out.append(sorted(keys) + [-1] * (k - len(keys)))
    return out


@pytest.mark.clause("C-NSA")
def test_index_logits_formula():
    g = torch.Generator().manual_seed(0)
    q, w, k = (
        torch.randn(5, 3, 8, generator=g),
        torch.randn(5, 3, generator=g),
        torch.randn(7, 8, generator=g),
    )
    got = index_logits(q, w, k)
    assert got.shape == (5, 7) and got.dtype == torch.float32
    for t in range(5):
        for s in range(7):
            want = sum(float(w[t, h]) * max(0.0, float(q[t, h] @ k[s])) for h in range(3))
            assert abs(float(got[t, s]) - want) <= 1e-5


@pytest.mark.clause("C-NSA")
def test_topk_ties_padding_example():
    # Keys 0..4; row at position 4 has logits [1, 3, 3, 0, 3]: k=2 keeps the two lowest of the tied 3s.
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [5.0, 9.0, 0.0, 0.0, 0.0]])
    pos = torch.tensor([4, 1])
    got = select_topk(mask_causal(logits.clone(), pos), pos, 2)
    assert got.tolist() == [[1, 2], [0, 1]]
    # k above the visible keys: every visible key, then -1 (position 1 sees 2 keys).
    assert select_topk(mask_causal(logits.clone(), pos), pos, 4).tolist() == [[0, 1, 2, 4], [0, 1, -1, -1]]
    assert select_topk(mask_causal(logits.clone(), pos), pos, 9)[1].tolist() == [0, 1] + [-1] * 7


@pytest.mark.clause("C-NSA")
@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12).flatmap(
        lambda b: st.tuples(
            st.just(b),
            st.lists(st.lists(st.integers(-3, 3), min_size=b, max_size=b), min_size=1, max_size=6),
            st.integers(1, 14),
        )
    ),
    st.data(),
)
def test_topk_matches_the_rule_text(case, data):
    """Small integer logits (many ties) on random causal rows: select_topk equals the brute-force rule."""
    b, rows, k = case
    positions = [data.draw(st.integers(0, b - 1)) for _ in rows]
    logits = torch.tensor(rows, dtype=torch.float32)
    got = select_topk(mask_causal(logits.clone(), torch.tensor(positions)), torch.tensor(positions), k)
    assert got.tolist() == brute_topk(rows, positions, k)


def test_near_ties():
    logits = torch.tensor([[4.0, 2.0, 2.0 * (1 + 1e-7), 1.0], [4.0, 2.0, 3.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    pos = torch.tensor([3, 3, 1])
    # Row 0: 2nd and 3rd largest within 1e-6 relative; row 1: 3 vs 2, no tie; row 2 sees only 2 keys.
    assert near_ties(logits, pos, 2).tolist() == [True, False, False]
    assert near_ties(logits, pos, 4).tolist() == [False, False, False]  # k >= keys: nothing to tie


@pytest.mark.clause("C-NSA")
def test_sparse_mla_is_softmax_over_the_selected_rows_only():
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(6, 10, generator=g)
    q = torch.randn(2, 3, 10, generator=g)
    topk = torch.tensor([[0, 2, 5, -1], [1, -1, -1, -1]])
    reads = []

    def read(p):
        reads.append(p.clone())
        return rows[p]

    got = sparse_mla(q, topk, read, latent_dim=4, sm_scale=0.5)
    for t, sel in enumerate([[0, 2, 5], [1]]):
        probs = torch.softmax(torch.einsum("hw,kw->hk", q[t], rows[sel]) * 0.5, dim=-1)
        torch.testing.assert_close(got[t], probs @ rows[sel][:, :4], rtol=0, atol=1e-6)
    assert sorted(torch.cat(reads).tolist()) == [0, 1, 2, 5]  # only the selected rows were read


@pytest.mark.clause("C-NSA")
def test_nsa_with_every_key_selected_equals_dense_reference():
    """The NSA model has the dense model's weights plus an indexer; with k above the sequence length its
    sparse MLA keeps every key and must give the dense output."""
    ids = torch.tensor(np.random.default_rng(0).integers(0, 512, 40))
    base = {k: v for k, v in SMALL_NSA.items() if not k.startswith(("attention", "index"))}
    dense = TinyDecoder(TinyDecoderConfig(**base)).reference_forward(ids)
    ref = TinyDecoder(TinyDecoderConfig(**SMALL_NSA, index_topk=64)).reference(ids)
    torch.testing.assert_close(ref.hidden, dense, rtol=0, atol=1e-6)
    assert ref.topk.shape == (40, 2, 64) and ref.near_tie.shape == (40, 2)
    # A small k selects, and changes the output.
    few = TinyDecoder(TinyDecoderConfig(**SMALL_NSA, index_topk=4)).reference(ids)
    assert (few.hidden - dense).abs().max() > 1e-3
    assert (few.topk[10, 0] >= 0).sum() == 4


def test_nsa_config_errors():
    with pytest.raises(ConfigError, match="needs kv_mode='mla', got kv_mode='mha'"):
        TinyDecoderConfig(kv_mode="mha", attention="nsa")
    with pytest.raises(ConfigError, match="attention='sparse' unknown"):
        TinyDecoderConfig(attention="sparse")
    with pytest.raises(ConfigError, match="index_rope_dim must be even and <= index_head_dim=16, got 32"):
        TinyDecoderConfig(attention="nsa", index_head_dim=16, index_rope_dim=32)
    with pytest.raises(ConfigError, match="index_topk must be >= 1, got 0"):
        TinyDecoderConfig(attention="nsa", index_topk=0)


@pytest.mark.clause("C-ESTIMATE")
def test_rank_runs_are_the_estimate_blocks():
    """SPEC C-ZIGZAG example C=2, P=1, L0=0, E=5 (owners 0,0,1,1,0) plus an unaligned prefix request:
    rank 0's runs are [0,2), [4,5) of request 0, located among its own tokens."""
    plan = plan_batch([0, 3], [5, 4], CPConfig(2, 1, "rotation"))
    own0 = np.flatnonzero(plan.token_owner == 0)
    runs = rank_runs(plan, 0, own0)
    assert [(r.req, r.a, r.b) for r in runs][:2] == [(0, 0, 2), (0, 4, 5)]
    assert runs[0].lo == 0 and all(r.hi - r.lo == r.b - r.a for r in runs)
    assert sum(r.hi - r.lo for r in runs) == own0.shape[0]
    with pytest.raises(DistError, match="rank 0: the plan's position runs cover"):
        rank_runs(plan, 0, own0[1:])


class _Group:
    """Stand-in for ``RankGroup`` where only ``world_size`` is read (configuration errors)."""

    world_size = 2


def test_kv_buffer_replicated_was_renamed_mirrored():
    with pytest.raises(ConfigError, match="'replicated' is now 'mirrored'"):
        create_kv_buffer(_Group(), SharedKVLayout(2, 4, 4), 1, 8, kind="replicated", tag="x")  # type: ignore


@pytest.mark.clause("C-RELOAD")
def test_host_hooks_copy_both_pools_on_the_owner_only():
    """backup(page) on the owner copies the page's latent and index-K rows; restore onto a new page of
    the same lane writes both back; other ranks hold nothing."""
    layout = SharedKVLayout(2, 4, 4)
    pools = {
        n: KVBuffer(layout, 1, torch.full((2, layout.num_slots, w), float("nan")), "shm")
        for n, w in (("latent", 6), ("index_k", 3))
    }
    slots = torch.arange(3 * 4, 4 * 4)  # page 3, lane 1
    for layer in range(2):
        for kv in pools.values():
            kv.write(layer, slots, torch.randn(4, kv.storage.shape[2]))
    restored: list[int] = []
    backup, restore = host_hooks(pools, 1, restored)
    payload = backup(3)
    assert set(payload) == {"latent", "index_k"} and payload["index_k"].shape == (2, 4, 3)
    restore(5, payload)  # page 5 is on lane 1 too
    for kv in pools.values():
        for layer in range(2):
            assert torch.equal(kv.read(layer, torch.arange(20, 24)), kv.read(layer, slots))
    assert restored == [5]
    other = host_hooks(pools, 0, [])
    assert other[0](3) is None  # rank 0 keeps no copy of a lane-1 page
    with pytest.raises(DistError, match="holds no host copy"):
        restore(7, None)


def test_case_pages_per_lane_per_lane_list():
    wl = make_workload([0], [10])
    assert DistCase(workload=wl, pages_per_lane=[3, 4]).resolved_pages_per_lane(2) == [3, 4]
    assert DistCase(workload=wl, pages_per_lane=5).resolved_pages_per_lane(3) == [5, 5, 5]
    assert DistCase(workload=wl, page_size=4).resolved_pages_per_lane(2) == [4, 4]  # ceil(10/4) + 1
    with pytest.raises(ConfigError, match="pages_per_lane has 2 entries, cp_size=4 needs 4"):
        DistCase(workload=wl, pages_per_lane=[3, 4]).resolved_pages_per_lane(4)
    with pytest.raises(ConfigError, match=r"pages_per_lane\[1\] must be >= 1, got 0"):
        DistCase(workload=wl, pages_per_lane=(3, 0)).resolved_pages_per_lane(2)
