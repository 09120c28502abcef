"""Allocator slots through the shared layout, up to the pool's last slot (SPEC C-ALLOC + C-LAYOUT).

Fill every usable page of a small pool (C=4, P=16, Q=2..3, so much more than one lane's worth) with
realistic requests (fresh, aligned and unaligned continuations), then direct-write one distinct value per
token into per-lane buffers (rank ``lane_of(slot)``, row ``write_slots(slot)``) and read every token back
from the rank-major concatenation of the lane buffers (row ``read_slots(slot)``). Done with numpy and torch.
"""

import random

import numpy as np
import pytest
import torch

from cpkv import CPConfig, LaneExhausted, OwnerLaneAllocator, SharedKVLayout

pytestmark = pytest.mark.unit

C, P = 4, 16


def fill_pool(Q: int, policy: str, seed: int) -> tuple[OwnerLaneAllocator, np.ndarray]:
    """Allocate until every usable page is taken; return the allocator and every token's slot (int64)."""
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy), Q)
    rng = random.Random(seed)
    reqs: list[list[int]] = []  # [seq_len, last_loc]
    slots: list[int] = []
    for _ in range(60):
        if reqs and rng.random() < 0.6:
            i = rng.randrange(len(reqs))
            L0, last = reqs[i]
        else:
            i, L0, last = None, 0, -1
        E = rng.randint(1, 2 * P + 3)
        try:
            res = alloc.alloc_extend([L0], [E], [last])
        except LaneExhausted:
            continue
        out = res.out_cache_loc.tolist()
        slots += out
        if i is None:
            reqs.append([E, out[-1]])
        else:
            reqs[i] = [L0 + E, out[-1]]
    # Top up the lanes the requests could not fill: whole pages through alloc_pages, P tokens each.
    rest = [r for r, n in enumerate(alloc.free_pages_per_lane().tolist()) for _ in range(n)]
    for p in alloc.alloc_pages(rest).tolist():
        slots += range(p * P, (p + 1) * P)
    return alloc, np.asarray(slots, dtype=np.int64)


@pytest.mark.clause("C-LAYOUT")
@pytest.mark.clause("C-ALLOC")
@pytest.mark.parametrize("Q", [2, 3])
@pytest.mark.parametrize("policy", ["rotation", "legacy", "balanced"])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_write_then_read_every_token_through_the_layout(Q, policy, backend):
    alloc, slots = fill_pool(Q, policy, seed=Q * 7 + len(policy))
    # The pool is full: every page but page 0 is used, more than one lane's worth (Q pages).
    assert alloc.total_free_pages == 0
    pages = np.unique(slots // P)
    assert pages.tolist() == list(range(1, C * Q))
    assert pages.size > Q
    assert len(set(slots.tolist())) == slots.size  # no slot handed out twice
    assert int(slots.max()) <= C * Q * P - 1

    layout = SharedKVLayout(C, P, alloc.pages_per_lane)
    rows = Q * P
    n = slots.size
    values = np.stack([np.arange(n) + 1000, -(np.arange(n) + 1000)], axis=1).astype(np.int64)  # [n, 2]

    if backend == "numpy":
        s, v = slots, values
        buffers = [np.zeros((rows, 2), dtype=np.int64) for _ in range(C)]
    else:
        s, v = torch.from_numpy(slots), torch.from_numpy(values)
        buffers = [torch.zeros((rows, 2), dtype=torch.int64) for _ in range(C)]

    lanes = layout.lane_of(s)
    write = layout.write_slots(s)
    read = layout.read_slots(s)
    assert type(lanes) is type(s) and type(write) is type(s) and type(read) is type(s)
    # Owner lane of the token = lane of its page (p % C), and the owned masks agree.
    assert np.asarray(lanes).tolist() == ((slots // P) % C).tolist()
    for r in range(C):
        assert np.asarray(layout.owned_mask(s, r)).tolist() == (np.asarray(lanes) == r).tolist()
    # Direct write: each rank writes only its own tokens into its own lane buffer.
    assert int(write.max()) < rows and int(write.min()) >= 0
    for r in range(C):
        mine = lanes == r
        buffers[r][write[mine]] = v[mine]
    # Every lane buffer received exactly its tokens: one row per token of that lane, no collisions.
    for r in range(C):
        assert int((lanes == r).sum()) == len(set(np.asarray(write[lanes == r]).tolist()))
    # Read back through the rank-major view: lane r's segment starts at row r * Q * P.
    if backend == "numpy":
        view = np.concatenate(buffers, axis=0)
        assert view.shape == (layout.num_slots, 2)
        got = view[read]
        assert np.array_equal(got, values)
    else:
        view = torch.cat(buffers, dim=0)
        assert view.shape == (layout.num_slots, 2)
        got = view[read]
        assert torch.equal(got, v)
    # The padding sentinel passes through every translation.
    pad = np.array([-1], dtype=np.int64) if backend == "numpy" else torch.tensor([-1])
    assert np.asarray(layout.read_slots(pad)).tolist() == [-1]
    assert np.asarray(layout.write_slots(pad)).tolist() == [-1]


@pytest.mark.clause("C-LAYOUT")
def test_last_slot_of_the_pool_lands_in_the_last_row_of_the_last_lane():
    # C=4, P=16, Q=3: page 11 is lane 3's local page 2 (the pool's last page). Its last slot 11*16+15 = 191
    # writes at (11 // 4) * 16 + 15 = 47 (lane 3's last row) and reads at (3*3 + 2) * 16 + 15 = 191.
    alloc = OwnerLaneAllocator(CPConfig(C, P, "rotation"), 3)
    assert alloc.alloc_pages([3, 3, 3]).tolist() == [3, 7, 11]
    layout = SharedKVLayout(C, P, alloc.pages_per_lane)
    slot = np.array([11 * P + 15], dtype=np.int64)
    assert layout.write_slots(slot).tolist() == [47]
    assert layout.read_slots(slot).tolist() == [191]
    assert layout.lane_of(slot).tolist() == [3]
