"""Differential test at cp_size=1: the owner-lane allocator against SGLang's own ``PagedTokenToKVPoolAllocator``.

Both take the lowest page first and put freed pages in front of the free list in the order they were
freed, so without ``need_sort`` every ``out_cache_loc`` is equal over the whole run; with ``need_sort``
(SGLang sorts its staged pages on its own schedule) they are equal until the first free and agree in
structure after it: the same ``None`` cases, the same new pages per request, the same offsets within
pages, and no duplicate, reserved or foreign page on either side.

page_size 1 is left out: SGLang builds this allocator only for pages of 2 tokens or more, and its
decode path counts no new page at page_size 1 (``seq_lens % 1 == 1`` never holds).
"""

import numpy as np
import pytest
import torch
from sglang_workload import Side, Workload

sgl = pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
paged = pytest.importorskip("sglang.srt.mem_cache.allocator.paged")

pytestmark = pytest.mark.sglang

OPS = 1500  # operations per case; each is one allocator call or a free group of several


def make_pair(pages: int, P: int, need_sort: bool):
    args = dict(
        size=pages * P, page_size=P, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=need_sort
    )
    ours = sgl.OwnerLaneTokenToKVPoolAllocator(**args, cp_size=1, owner_policy="balanced")
    return Side(ours), Side(paged.PagedTokenToKVPoolAllocator(**args))


def new_pages(parts: list[list[int]], before: list[int], P: int) -> list[int]:
    """Per request: pages of its new slots that its prefix did not already touch."""
    return [
        len({s // P for s in part} - {s // P for s in prefix[-1:]})
        for part, prefix in zip(parts, before, strict=True)
    ]


def check_side(side: Side, num_pages: int, P: int) -> None:
    live = side.live_slots()
    pages = live // P
    assert np.unique(live).shape[0] == live.shape[0], "a slot is held twice"
    assert ((pages >= 1) & (pages <= num_pages)).all(), "reserved page 0 or a foreign page handed out"
    owner = {}
    for rid, row in side.rows.items():
        for p in {s // P for s in row}:
            assert owner.setdefault(p, rid) == rid, f"page {p} shared by requests {owner[p]} and {rid}"
    free = side.alloc.get_all_free_pages().tolist()
    assert set(free).isdisjoint(owner) and len(set(free)) == len(free)
    assert set(free) | set(owner) == set(range(1, num_pages + 1)), "a page leaked"


@pytest.mark.clause("C-ALLOC")
@pytest.mark.clause("C-ATOMIC")
@pytest.mark.parametrize("P", [2, 4, 16])
@pytest.mark.parametrize("need_sort", [False, True])
def test_out_cache_loc_matches_sglang_paged_allocator(P, need_sort):
    pages = 40
    ours, peer = make_pair(pages, P, need_sort)
    work = Workload(seed=1000 * P + need_sort, page_size=P, max_extend=5 * P)
    freed = False
    calls = nones = 0
    for _ in range(OPS):
        op = work.draw()
        before = {rid: list(row) for rid, row in ours.rows.items()}
        got, want = ours.apply(op), peer.apply(op)
        calls += len(op[1]) if op[0] == "group" else 1
        assert (got is None) == (want is None), (op, got, want)
        nones += got is None
        if got is not None and op[0] in ("extend", "decode", "alloc"):
            if not freed or not need_sort:
                assert got == want, op
            flat_got, flat_want = sum(got, []), sum(want, [])
            assert [s % P for s in flat_got] == [s % P for s in flat_want], op
            rids = [r for r, _ in op[1]] if op[0] == "extend" else op[1] if op[0] == "decode" else [op[1]]
            prefixes = [before.get(rid, []) for rid in rids]
            peer_prefixes = [peer.rows[rid][: len(p)] for rid, p in zip(rids, prefixes, strict=True)]
            assert new_pages(got, prefixes, P) == new_pages(want, peer_prefixes, P), op
        work.commit(op, got)
        freed |= Workload.frees(op)
        assert ours.alloc.available_size() == peer.alloc.available_size()
        check_side(ours, pages, P)
        check_side(peer, pages, P)
    assert calls >= 1000 and nones >= 20 and freed  # the run reached exhaustion and reuse


@pytest.mark.parametrize("need_sort", [False, True])
def test_free_groups_release_in_sglangs_order(need_sort):
    """Inside a group, ``free`` and ``free_segment`` wait; at the end SGLang hands the page ids freed by
    id out first, then the pages of the freed slots (each ascending here)."""
    P = 4
    ours, peer = make_pair(16, P, need_sort)
    for side in (ours, peer):
        side.apply(("extend", [(0, 4 * P), (1, 3 * P)]))  # pages 1-4 and 5-7
        side.apply(("group", [("free", 0), ("truncate", 1, P)]))  # slots of 1-4, then ids 6, 7
        assert side.rows == {1: [5 * P + o for o in range(P)]}
        assert side.apply(("alloc", 2, 15 * P)) is not None  # all 15 free pages, in free-list order
    order = [ours.rows[2][i] // P for i in range(0, 15 * P, P)]
    assert order == [peer.rows[2][i] // P for i in range(0, 15 * P, P)]
    if not need_sort:
        assert order == [6, 7, 1, 2, 3, 4] + list(range(8, 17))
