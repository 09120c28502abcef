"""SGLang's out-of-tree paged allocator contract, on the owner-lane subclass.

SGLang's own CPU test of the contract (``test_allocator_oot_contract.py`` upstream) builds a
``PagedTokenToKVPoolAllocator`` subclass the way a platform plugin's ``get_paged_allocator_cls()`` hands
it back (six arguments, ``size = 8 pages``, ``page_size = 16``, float16, CPU, a stand-in KV cache,
``need_sort=False``) and checks that ``alloc(32)`` gives two whole pages, each page's slots complete and
in order. The same scenario here, at several ``cp_size``, plus the rest of what SGLang relies on.
"""

import types

import pytest
import torch

sgl = pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
paged = pytest.importorskip("sglang.srt.mem_cache.allocator.paged")

from cpkv import AllocatorError, ConfigError  # noqa: E402

pytestmark = pytest.mark.sglang

Allocator = sgl.OwnerLaneTokenToKVPoolAllocator


def make(cls=Allocator, page_size=16, **kw):
    return cls(
        size=page_size * 8,
        page_size=page_size,
        dtype=torch.float16,
        device="cpu",
        kvcache=types.SimpleNamespace(),
        need_sort=False,
        **kw,
    )


@pytest.mark.parametrize("cp_size", [1, 2, 4])
def test_alloc_returns_whole_pages_in_order(cp_size):
    alloc = make(cp_size=cp_size)
    assert isinstance(alloc, paged.PagedTokenToKVPoolAllocator)
    out = alloc.alloc(32)
    assert out is not None and out.dtype == torch.int64 and out.device.type == "cpu"
    assert out.numel() == 32
    pages = sorted({s // 16 for s in out.tolist()})
    assert len(pages) == 2 and 0 not in pages
    for p in pages:
        assert sorted(s for s in out.tolist() if s // 16 == p) == [p * 16 + i for i in range(16)]
    assert out.tolist() == sum(([p * 16 + i for i in range(16)] for p in (out[::16] // 16).tolist()), [])


def test_platform_hook_class_is_built_with_sglangs_six_arguments():
    """``get_paged_allocator_cls()`` returns a class; SGLang's swa.py passes the six arguments by position."""
    bound = Allocator.for_group(4, "balanced")
    assert issubclass(bound, paged.PagedTokenToKVPoolAllocator)
    alloc = bound(64, 4, torch.bfloat16, "cpu", None, False)
    assert (alloc.cp_size, alloc.config.owner_policy) == (4, "balanced")
    assert alloc.size == 4 * 64 and alloc.num_pages == 4 * 16  # 4 lanes of 16 pages (+ a padding page each)
    assert alloc.available_size() == alloc.aggregate_free_size() == 4 * 64
    assert alloc.get_all_free_pages().tolist() == list(range(4, 4 * 17))  # pages 0..3: local page 0 of a lane
    with pytest.raises(ConfigError, match="cp_size"):
        Allocator.for_group(0)


def test_at_cp_size_1_the_page_ids_are_sglangs():
    ours, peer = (
        make(page_size=4),
        paged.PagedTokenToKVPoolAllocator(32, 4, torch.float16, "cpu", None, False),
    )
    assert (ours.size, ours.num_pages, ours.available_size()) == (
        peer.size,
        peer.num_pages,
        peer.available_size(),
    )
    assert ours.get_all_free_pages().tolist() == peer.get_all_free_pages().tolist() == list(range(1, 9))


def test_clear_and_resize_free_everything():
    alloc = make(cp_size=2)
    alloc.alloc(64)
    alloc.clear()
    assert alloc.available_size() == 2 * 128 and alloc.last_plan is None
    alloc.alloc(16)
    alloc.resize(types.SimpleNamespace(max_total_num_tokens=16 * 4))
    assert alloc.size == 2 * 64 and alloc.available_size() == 2 * 64
    assert alloc.get_all_free_pages().tolist() == list(range(2, 2 * 5))


def test_bad_calls_raise_typed_errors_and_change_nothing():
    alloc = make(page_size=4, cp_size=2)
    out = alloc.alloc(8)
    before = alloc.get_all_free_pages().tolist()
    with pytest.raises(AllocatorError, match="page 0: a padding page"):
        alloc.free(torch.tensor([0, int(out[0])]))
    with pytest.raises(AllocatorError, match="page 1: a padding page"):
        alloc.free_page_ids(torch.tensor([int(out[0]) // 4, 1]))
    with pytest.raises(AllocatorError, match="already free"):
        alloc.free(torch.tensor([int(out[0]), 4 * int(before[0])]))
    with pytest.raises(AllocatorError, match="not page-aligned"):
        alloc.free_segment(out[2:], start_pos=2)
    with pytest.raises(AllocatorError, match="extend_num_tokens=5"):
        t = torch.tensor([0])
        alloc.alloc_extend(t, t, t + 4, t + 4, t - 1, 5)
    alloc.free_group_begin()
    with pytest.raises(AllocatorError, match="nested"):
        alloc.free_group_begin()
    alloc.free_group_end()
    with pytest.raises(AllocatorError, match="without free_group_begin"):
        alloc.free_group_end()
    assert alloc.get_all_free_pages().tolist() == before
