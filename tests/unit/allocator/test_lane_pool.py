"""``LanePool``, the allocator's page pool, against a plain-Python model of per-lane stacks (SPEC C-ALLOC).

The model keeps each lane's free ids as a Python list, top at the end, lowest ids on top when fresh;
``pick`` takes runs off the tops in order, ``release`` pushes a lane's pages back so the first listed is
on top. Every call sequence must give the model's pages and leave the model's state, and a call that
raises must change nothing.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.allocator import LanePool
from cpkv.errors import AllocatorError, LaneExhausted

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ALLOC")]


class Model:
    def __init__(self, caps):
        C = len(caps)
        self.C = C
        self.stacks = [[q * C + r for q in range(caps[r] - 1, -1, -1) if q * C + r != 0] for r in range(C)]
        self.held: set[int] = set()

    def pick(self, runs):
        taken = [0] * self.C
        out = []
        for lane, n in runs:
            for _ in range(n):
                taken[lane] += 1
                if taken[lane] > len(self.stacks[lane]):
                    raise LaneExhausted(lane, 0, 0)
                out.append(self.stacks[lane][-taken[lane]])
        return out, taken

    def commit(self, pages, taken):
        for r in range(self.C):
            del self.stacks[r][len(self.stacks[r]) - taken[r] :]
        self.held |= set(pages)

    def release(self, pages):
        for p in reversed(pages):
            self.stacks[p % self.C].append(p)
        self.held -= set(pages)


@settings(max_examples=150, deadline=None)
@given(C=st.integers(1, 5), data=st.data())
def test_pool_follows_the_model(C, data):
    caps = data.draw(st.lists(st.integers(1, 6), min_size=C, max_size=C), label="caps")
    pool, model = LanePool(caps), Model(caps)
    assert pool.capacity_per_lane.tolist() == [len(s) for s in model.stacks]
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        if model.held and data.draw(st.booleans(), label="release"):
            pages = data.draw(
                st.lists(st.sampled_from(sorted(model.held)), min_size=1, unique=True), label="pages"
            )
            arr = np.array(pages, dtype=np.int64)
            pool.check_held(arr)
            pool.release(arr)
            model.release(pages)
        else:
            runs = data.draw(
                st.lists(st.tuples(st.integers(0, C - 1), st.integers(1, 3)), max_size=4), label="runs"
            )
            try:
                want = model.pick(runs)
            except LaneExhausted:
                before = pool.digest()
                with pytest.raises(LaneExhausted):
                    pool.pick(np.array([r for r, _ in runs], dtype=np.int64), np.array([n for _, n in runs]))
                assert pool.digest() == before
                continue
            owners = np.array([r for r, _ in runs], dtype=np.int64)
            pages, counts = pool.pick(owners, np.array([n for _, n in runs], dtype=np.int64))
            assert pages.tolist() == want[0] and counts.tolist() == want[1]
            one_each = [r for r, n in runs for _ in range(n)]
            again = pool.pick_one_each(one_each)
            assert again is not None and again[0].tolist() == want[0] and again[1].tolist() == want[1]
            pool.commit(pages, counts)
            model.commit(want[0], want[1])
        assert pool.free.tolist() == [len(s) for s in model.stacks]
        assert [pool.lane_stack(r).tolist() for r in range(C)] == model.stacks
        ids = np.arange(pool.num_pages + 1)
        assert set(np.flatnonzero(pool.is_held(ids)).tolist()) == model.held


def test_checks_name_the_page_and_change_nothing():
    pool = LanePool([3, 3])  # pages 2, 4 on lane 0 (page 0 reserved); 1, 3, 5 on lane 1
    pages, counts = pool.pick(np.array([0, 1]), np.array([1, 2]))
    assert pages.tolist() == [2, 1, 3] and counts.tolist() == [1, 2]
    assert pool.pick_one_each([0, 0, 0]) is None  # lane 0 holds only two free pages
    pool.commit(pages, counts)
    before = pool.digest()
    for bad, match in (
        ([0], "page 0: it is reserved"),
        ([4], "page 4: it is already free"),
        ([2, 2], "page 2: listed more than once"),
    ):
        with pytest.raises(AllocatorError, match=match):
            pool.check_held(np.array(bad))
    assert pool.digest() == before and pool.changes == 1
    # last_loc checks: prefix 3 at P=2 ends on page 1 (slot 2, held); prefix 0 needs -1.
    assert pool.valid_last_locs(np.array([3, 0]), np.array([2, -1]), 2) is not None
    assert pool.valid_last_locs(np.array([3]), np.array([8]), 2) is None  # page 4 is free
    assert pool.valid_last_locs(np.array([0]), np.array([2]), 2) is None  # no prefix but a last_loc
    with pytest.raises(ValueError):
        pool.free[0] = 9  # read-only view


def test_copies_keep_their_own_live_free_counts():
    import copy
    import pickle

    pool = LanePool([4, 4])
    for clone in (copy.deepcopy(pool), pickle.loads(pickle.dumps(pool))):
        pages, counts = clone.pick(np.array([1]), np.array([2]))
        clone.commit(pages, counts)
        assert clone.free.tolist() == [3, 2] and pool.free.tolist() == [3, 4]  # the view follows its own pool
        assert not clone.free.flags.writeable
