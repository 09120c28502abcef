"""The distributed executor's parts, in one process: model, workload, KV buffer, scheduler, errors."""

import pickle

import numpy as np
import pytest
import torch

from cpkv import ConfigError, LaneExhausted, PlanError
from cpkv.executor import (
    KVBuffer,
    LaneWriteError,
    RankOrderError,
    RemoteRankError,
    ReplicatedScheduler,
    TinyDecoder,
    TinyDecoderConfig,
    check_rank_order,
    make_workload,
)
from cpkv.executor.group import pickle_error
from cpkv.executor.workload import split_lengths
from cpkv.layout import SharedKVLayout

pytestmark = pytest.mark.distributed

SMALL = dict(kv_lora_rank=32, rope_dim=8, hidden_size=32, mlp_size=64)


# ------------------------------------------------------------------------------------------ self-check
def test_rank_order_self_check():
    check_rank_order([0, 1, 2, 3], 4)
    with pytest.raises(RankOrderError, match=r"slot 0 holds rank 1, not 0"):
        check_rank_order([1, 0, 2, 3], 4)
    with pytest.raises(RankOrderError, match=r"returned 3 slots for world_size=4"):
        check_rank_order([0, 1, 2], 4)


# ----------------------------------------------------------------------------------------------- model
@pytest.mark.parametrize("kv_mode", ["mla", "mha"])
def test_reference_is_causal_and_seeded(kv_mode):
    """Hidden state at position t depends only on tokens 0..t: a truncated sequence gives the same rows."""
    m = TinyDecoder(TinyDecoderConfig(kv_mode=kv_mode, **SMALL))
    ids = torch.tensor(np.random.default_rng(0).integers(0, 512, 40))
    full = m.reference_forward(ids)
    assert full.shape == (40, 32) and full.dtype == torch.float32
    torch.testing.assert_close(m.reference_forward(ids[:17]), full[:17], rtol=0, atol=1e-6)
    # Changing a later token leaves earlier positions alone and changes its own.
    ids2 = ids.clone()
    ids2[30] = (ids[30] + 1) % 512
    other = m.reference_forward(ids2)
    torch.testing.assert_close(other[:30], full[:30], rtol=0, atol=1e-6)
    assert (other[30] - full[30]).abs().max() > 1e-3
    # Same seed, same weights; another seed, other weights.
    assert TinyDecoder(m.config).weights_digest() == m.weights_digest()
    assert (
        TinyDecoder(TinyDecoderConfig(kv_mode=kv_mode, seed=1, **SMALL)).weights_digest()
        != m.weights_digest()
    )


def test_kv_row_width_and_config_errors():
    assert TinyDecoderConfig().kv_row_width == 576  # 512 latent + 64 rotary (DeepSeek MLA sizes)
    assert TinyDecoderConfig(kv_mode="mha", num_heads=4, head_dim=16).kv_row_width == 128
    with pytest.raises(ConfigError, match="kv_mode='gqa'"):
        TinyDecoderConfig(kv_mode="gqa")
    with pytest.raises(ConfigError, match="rotary width must be even, got 7"):
        TinyDecoderConfig(rope_dim=7)
    with pytest.raises(ConfigError, match="num_layers must be >= 1, got 0"):
        TinyDecoderConfig(num_layers=0)


def test_rotary_uses_global_positions():
    """A key computed at global position p in a chunk equals the same key computed in the full sequence."""
    m = TinyDecoder(TinyDecoderConfig(**SMALL))
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([100, 101, 102, 103, 104])
    rows = m.kv_rows(0, x, pos)
    torch.testing.assert_close(m.kv_rows(0, x[2:], pos[2:]), rows[2:], rtol=0, atol=1e-6)
    assert (m.kv_rows(0, x, pos - 100) - rows).abs().max() > 1e-3  # positions matter


# -------------------------------------------------------------------------------------------- workload
def test_make_workload_forwards():
    assert split_lengths(7, 3) == [3, 2, 2]
    wl = make_workload([0, 5], [7, 3], chunks=3, seed=0, reuse=True)
    assert [len(t) for t in wl.requests] == [7, 8, 7 + 3, 8 + 1]
    assert wl.requests[2][:7] == wl.requests[0] and wl.requests[3][:8] == wl.requests[1]
    assert wl.forwards == (
        ((1, 5),),  # prefix fill
        ((0, 3), (1, 6)),  # chunks of 7 -> 3,2,2 and of 3 -> 1,1,1
        ((0, 5), (1, 7)),
        ((0, 7), (1, 8)),
        ((2, 9), (3, 9)),  # reuse wave: fresh 3 -> first forward stops 3 // 2 = 1 short; fresh 1 -> 0 short
        ((2, 10),),
    )
    assert wl.flush_before == frozenset()
    assert make_workload([0], [4], reload=True).flush_before == frozenset({1})
    with pytest.raises(PlanError, match="request 1: extend_len=0"):
        make_workload([0, 3], [2, 0])
    with pytest.raises(PlanError, match="one prefix_len per extend_len"):
        make_workload([0], [2, 3])


# ------------------------------------------------------------------------------------------- KV buffer
@pytest.mark.clause("C-LAYOUT")
def test_kv_buffer_writes_own_lane_reads_rank_major():
    """SPEC section 3 example geometry C=4, P=64, Q=8: slot 197 (page 3, lane 3) is write slot 5 of
    lane 3 and read slot 1541 = 3*8*64 + 5 of the rank-major view."""
    layout = SharedKVLayout(4, 64, 8)
    storage = torch.full((2, layout.num_slots, 3), float("nan"))
    kv = KVBuffer(layout, 3, storage, "shm")
    row = torch.tensor([[1.0, 2.0, 3.0]])
    kv.write(1, torch.tensor([197]), row)
    assert torch.equal(storage[1, 1541], row[0])
    assert torch.equal(kv.read(1, torch.tensor([197])), row)
    written = torch.zeros(2, layout.num_slots, dtype=torch.bool)
    written[1, 1541] = True
    assert storage[~written].isnan().all()  # nothing else touched, no other layer either
    with pytest.raises(LaneWriteError, match="rank 3 asked to write slot 128 of lane 2"):
        kv.write(0, torch.tensor([197, 128]), torch.zeros(2, 3))
    with pytest.raises(LaneWriteError, match="slot -1"):
        kv.write(0, torch.tensor([-1]), torch.zeros(1, 3))


# ------------------------------------------------------------------------------------------- scheduler
@pytest.mark.clause("C-ALLOC")
def test_scheduler_replicas_agree_and_release_pages():
    """Two replicas fed the same workload make the same decisions (digest after every forward); at the
    end the requests hold nothing: every used page belongs to the prefix cache."""
    from cpkv import CPConfig

    wl = make_workload([0, 19, 32], [9, 40, 3], chunks=3, seed=4, reuse=True)
    a, b = (ReplicatedScheduler(CPConfig(4, 16, "rotation"), 12, wl) for _ in range(2))
    for f in range(len(wl.forwards)):
        ba, bb = a.schedule(f), b.schedule(f)
        assert torch.equal(ba.out_cache_loc, bb.out_cache_loc)
        assert a.digest() == b.digest()
        # kv_slots of request i: prefix slots then this forward's out_cache_loc slice.
        ind = ba.alloc.plan.extend_indptr
        for i in range(ba.request_ids.shape[0]):
            assert torch.equal(
                ba.kv_slots[i][-(ind[i + 1] - ind[i]) :], ba.out_cache_loc[ind[i] : ind[i + 1]]
            )
        a.finish(ba)
        b.finish(bb)
    assert a.req_to_token == {}
    assert int(a.allocator.used_pages_per_lane().sum()) == a.cache.total_cached_pages > 0
    no_cache = ReplicatedScheduler(CPConfig(2, 16, "legacy"), 12, wl, prefix_cache=False)
    for f in range(len(wl.forwards)):
        no_cache.finish(no_cache.schedule(f))
    assert no_cache.allocator.used_pages_per_lane().tolist() == [0, 0]


def test_scheduler_rejects_a_forward_that_goes_backwards():
    from cpkv import CPConfig

    wl = make_workload([0], [10], chunks=2)
    bad = type(wl)(requests=wl.requests, forwards=(((0, 5),), ((0, 5),)))
    s = ReplicatedScheduler(CPConfig(2, 4), 8, bad, prefix_cache=False)
    s.finish(s.schedule(0))
    with pytest.raises(PlanError, match="request 0 holds 5 tokens, cannot advance to end=5"):
        s.schedule(1)


# ----------------------------------------------------------------------------------------------- errors
def test_errors_cross_process_boundaries_typed():
    e = pickle.loads(pickle_error(LaneExhausted(2, 5, 1), rank=1, where="schedule"))
    assert type(e) is LaneExhausted and (e.lane, e.needed, e.available) == (2, 5, 1)

    class Local(Exception):  # not importable by name, so not picklable
        pass

    e = pickle.loads(pickle_error(Local("boom"), rank=3, where="forward 2"))
    assert type(e) is RemoteRankError and (e.rank, e.where) == (3, "forward 2")
    assert "Local('boom')" in str(e)
