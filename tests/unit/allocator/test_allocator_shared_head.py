"""Two requests of one call may not extend the same partly filled page: their head tokens would take the
same slots (C-HEAD, C-FAIL-FAST). Found by a fresh-eyes review: ``alloc_extend([6, 6], [1, 1], [9, 9])``
returned slots ``[10, 10]``. Every entry point raises ``AllocatorError`` and takes nothing; requests that
share whole pages (a page-aligned cached prefix) are fine.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from allocator_state import snapshot
from cpkv import AllocatorError, CPConfig, OwnerLaneAllocator

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-HEAD"), pytest.mark.clause("C-FAIL-FAST")]


def _held_prefix(policy: str = "rotation") -> tuple[OwnerLaneAllocator, int]:
    """C=4, P=4, 8 pages per lane; one 6-token request holds two pages; returns its last_loc (on the second
    page, two of its four slots used)."""
    alloc = OwnerLaneAllocator(CPConfig(cp_size=4, page_size=4, owner_policy=policy), 8)
    last = int(alloc.alloc_extend([0], [6], [-1]).out_cache_loc[-1])
    assert last % 4 == 1
    return alloc, last


def _message(last: int) -> str:
    return (
        f"requests 0 and 1: last_loc={last} and last_loc={last} lie on page {last // 4}, partly filled, and "
        "both extend it: their head tokens would take the same slots (copy a shared partly filled page "
        "before extending it)"
    )


@pytest.mark.parametrize("policy", ["rotation", "legacy", "balanced"])
@pytest.mark.parametrize(
    "call",
    [
        lambda a, x: a.alloc_extend([6, 6], [1, 1], [x, x]),  # single-page path
        lambda a, x: a.alloc_extend([6, 6], [5, 40], [x, x]),  # general path (40 tokens: many pages)
        lambda a, x: a.alloc_decode([6, 6], [x, x]),
        lambda a, x: a.alloc_draft([6, 6], [x, x], 3),
        lambda a, x: a.plan_extend([6, 6], [1, 1], [x, x]),
    ],
    ids=["extend-small", "extend-general", "decode", "draft", "plan_extend"],
)
def test_two_requests_extending_one_partly_filled_page_raise_and_take_nothing(policy, call):
    alloc, last = _held_prefix(policy)
    before = snapshot(alloc)
    with pytest.raises(AllocatorError) as info:
        call(alloc, last)
    assert str(info.value) == _message(last)
    assert snapshot(alloc) == before


def test_sharing_whole_pages_or_not_extending_is_fine():
    alloc = OwnerLaneAllocator(CPConfig(cp_size=4, page_size=4), 8)
    end = int(alloc.alloc_extend([0], [8], [-1]).out_cache_loc[-1])  # two full pages: end closes the second
    a = alloc.alloc_extend([8, 8], [1, 1], [end, end])  # a whole shared prefix: each takes a new page
    assert a.new_pages.shape[0] == 2 and len(set(a.out_cache_loc.tolist())) == 2
    b, last = _held_prefix()
    c = b.alloc_extend([6, 6], [1, 0], [last, last])  # only one of the two extends the partly filled page
    assert c.out_cache_loc.tolist() == [last + 1]


@hsettings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9)), min_size=2, max_size=6),
    st.sampled_from(["rotation", "legacy", "balanced"]),
)
def test_no_slot_is_handed_out_twice_in_one_call(rows, policy):
    # Requests continue one of four held sequences (random lengths 1..9 tokens on), or raise; when the call
    # succeeds no slot appears twice, and when it raises the state is unchanged.
    P = 4
    alloc = OwnerLaneAllocator(CPConfig(cp_size=2, page_size=P, owner_policy=policy), 64)
    seqs = []
    for n in (5, 6, 7, 9):  # four sequences, each ending inside a page
        a = alloc.alloc_extend([0], [n], [-1])
        seqs.append((n, int(a.out_cache_loc[-1])))
    L0 = [seqs[s][0] for s, _ in rows]
    last = [seqs[s][1] for s, _ in rows]
    E = [e for _, e in rows]
    before = snapshot(alloc)
    shared = len({s for s, _ in rows}) < len(rows)
    if shared:
        with pytest.raises(AllocatorError, match="partly filled"):
            alloc.alloc_extend(L0, E, last)
        assert snapshot(alloc) == before
    else:
        out = alloc.alloc_extend(L0, E, last).out_cache_loc.numpy()
        assert np.unique(out).shape[0] == out.shape[0]
