"""Pool kinds (SPEC C-POOL): a sharded pool translates by owner, a replicated one as with C = 1 on every rank.

A replicated pool (e.g. a draft model's KV when its attention has no cross-rank softmax merge) has no
owners: every rank holds every page; slot translations give the slot itself, and owner translations
raise ``PoolKindError`` instead of silently filtering or remapping rows.
"""

import numpy as np
import pytest
import torch

from cpkv import (
    POOL_KINDS,
    ConfigError,
    CPConfig,
    LayoutError,
    OwnerLaneAllocator,
    PoolKindError,
    SharedKVLayout,
)

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-POOL")]

# SPEC section 3 slots, with 512 replaced by 511: a replicated pool of Q=8 pages of 64 has 512 slots.
SLOTS = [0, 63, 64, 65, 128, 197, 511, -1]


def test_kinds_and_default():
    assert POOL_KINDS == ("sharded", "replicated")
    assert SharedKVLayout(4, 64, 8).kind == "sharded"
    assert SharedKVLayout(4, 64, 8, "replicated").kind == "replicated"
    assert OwnerLaneAllocator(CPConfig(4, 64), 8).kind == "sharded"


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16])
def test_replicated_translates_as_cp_size_1_numpy(dtype):
    # C = 1: write (p // 1) * P + o = s, read ((p % 1) * Q + p) * P + o = s; -1 passes through.
    layout = SharedKVLayout(4, 64, 8, kind="replicated")
    one = SharedKVLayout(1, 64, 8)
    s = np.asarray(SLOTS, dtype=dtype)
    for fn, ref in ((layout.read_slots, one.read_slots), (layout.write_slots, one.write_slots)):
        out = fn(s)
        assert isinstance(out, np.ndarray) and out.dtype == dtype
        assert out.tolist() == SLOTS == ref(s).tolist()
        assert out is not s and not np.shares_memory(out, s)  # a new array, as every translation returns
    assert layout.num_slots == layout.lane_slots == 8 * 64  # every rank holds all Q pages


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_replicated_translates_as_cp_size_1_torch(dtype):
    layout = SharedKVLayout(8, 64, 8, kind="replicated")
    s = torch.tensor(SLOTS, dtype=dtype)
    for out in (layout.read_slots(s), layout.write_slots(s)):
        assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == s.device
        assert out.tolist() == SLOTS
    assert layout.read_slots([1, 2]).tolist() == [1, 2]  # a Python sequence comes back as numpy


@pytest.mark.parametrize("what", ["lane_of", "owned_mask"])
def test_owner_translation_of_a_replicated_pool_raises(what):
    layout = SharedKVLayout(4, 64, 8, kind="replicated")
    call = (lambda s: layout.lane_of(s)) if what == "lane_of" else (lambda s: layout.owned_mask(s, 2))
    with pytest.raises(
        PoolKindError, match=rf"{what} is an owner translation, but this pool is replicated"
    ) as info:
        call(np.asarray(SLOTS))
    assert isinstance(info.value, LayoutError) and isinstance(info.value, ValueError)


def test_sharded_is_unchanged():
    # The SPEC section 3 example still holds for the default (sharded) kind.
    layout = SharedKVLayout(4, 64, 8, kind="sharded")
    s = np.array([0, 63, 64, 65, 128, 197, 512, -1])
    assert layout.read_slots(s).tolist() == [0, 63, 512, 513, 1024, 1541, 128, -1]
    assert layout.write_slots(s).tolist() == [0, 63, 0, 1, 0, 5, 128, -1]
    assert layout.owned_mask(s, 2).tolist() == [False, False, False, False, True, False, False, False]
    assert layout.num_slots == 4 * 8 * 64


def test_replicated_slot_range_and_bad_kind():
    layout = SharedKVLayout(4, 64, 8, kind="replicated")
    with pytest.raises(LayoutError, match=r"slot 512 out of range: the pool has 512 slots \(replicated: "):
        layout.read_slots([512])
    for bad in ("Replicated", "mirror", None, 1):
        with pytest.raises(ConfigError, match=r"pool kind=.* is unknown; use one of sharded, replicated"):
            SharedKVLayout(4, 64, 8, kind=bad)
        with pytest.raises(ConfigError, match=r"pool kind=.* is unknown"):
            OwnerLaneAllocator(CPConfig(4, 64), 8, kind=bad)


@pytest.mark.parametrize("policy", ["rotation", "legacy", "balanced"])
def test_replicated_allocator_is_the_cp_size_1_allocator(policy):
    # No owners: one lane of pages 1 .. Q-1, every phase 0, every token on lane 0; the same calls give the
    # same pages as CPConfig(1, P) (the cp_size of the group does not matter).
    rep = OwnerLaneAllocator(CPConfig(4, 4, policy), 8, kind="replicated")
    one = OwnerLaneAllocator(CPConfig(1, 4, policy), 8)
    assert rep.config == CPConfig(1, 4, policy)
    assert rep.free_pages_per_lane().tolist() == [7]
    a = rep.alloc_extend([0, 0], [6, 9], [-1, -1])
    b = one.alloc_extend([0, 0], [6, 9], [-1, -1])
    # Fresh: lowest ids first: request 0 -> pages 1, 2; request 1 -> pages 3, 4, 5.
    assert a.new_pages.tolist() == b.new_pages.tolist() == [1, 2, 3, 4, 5]
    assert a.out_cache_loc.tolist() == [4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    assert a.plan.request_phases.tolist() == [0, 0] and set(a.plan.token_owner.tolist()) == {0}
    d = rep.alloc_draft([9], [20], 3)  # positions 9, 10, 11: slots 21, 22, 23 in page 5
    assert d.out_cache_loc.tolist() == [21, 22, 23] and d.new_pages.tolist() == []
    # Its slots are rows of the replicated layout of the same pool, on every rank.
    layout = SharedKVLayout(4, 4, 8, kind="replicated")
    assert layout.read_slots(a.out_cache_loc).tolist() == a.out_cache_loc.tolist()


def test_replicated_allocator_takes_one_page_count():
    with pytest.raises(ConfigError, match=r"a replicated pool has one page count.*\[8, 8\]"):
        OwnerLaneAllocator(CPConfig(2, 4), [8, 8], kind="replicated")


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_kernel_translations_of_a_replicated_pool(monkeypatch, dtype):
    # cpkv.kernels (Triton, here through its CPU interpreter) must not apply the sharded formula to a
    # replicated pool: slot 511 would read at row 1663 and write at 127 of a pool that has 512 rows.
    pytest.importorskip(
        "triton", reason="Triton is not installed: `pip install -e '.[gpu]'` (make test does)"
    )
    from cpkv import kernels as K

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("CPKV_KERNELS", raising=False)
    layout = SharedKVLayout(4, 64, 8, kind="replicated")
    s = torch.tensor(SLOTS, dtype=dtype)
    assert K.read_slots(layout, s).tolist() == SLOTS and K.write_slots(layout, s).tolist() == SLOTS
    assert K.read_slots(layout, s).dtype == dtype
    with pytest.raises(PoolKindError, match=r"owned_mask is an owner translation"):
        K.owned_mask(layout, s, 2)
