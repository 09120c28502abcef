"""Allocator errors (SPEC C-ATOMIC, C-FAIL-FAST, C-ALLOC ``free``): typed, named, and nothing changes.

Every failing call is bracketed by a full snapshot of the allocator: ``state_digest()``,
``free_pages_per_lane()``, ``is_free`` over every page id and the bytes of the internal ``_free`` array.
"""

import numpy as np
import pytest
import torch

from allocator_state import snapshot
from cpkv import AllocatorError, ConfigError, CPConfig, LaneExhausted, OwnerLaneAllocator, PlanError

pytestmark = pytest.mark.unit


def used_allocator() -> OwnerLaneAllocator:
    """C=4, P=4, Q=8 with request A (L0=0, E=6 -> pages 4 (lane 0), 1 (lane 1), slots 16..19, 4, 5)."""
    alloc = OwnerLaneAllocator(CPConfig(4, 4, "rotation"), 8)
    res = alloc.alloc_extend([0], [6], [-1])
    assert res.new_pages.tolist() == [4, 1]
    assert res.out_cache_loc.tolist() == [16, 17, 18, 19, 4, 5]
    return alloc


# ----------------------------------------------------------------------------------------------------
# C-ATOMIC
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-ATOMIC")
def test_lane_exhausted_names_lane_needed_available_and_changes_nothing():
    # C=4, P=64, Q=4: usable [3, 4, 4, 4]. L0=0, E=1000 needs owners [0,0,1,1,2,2,3,3,3,3,2,2,1,1,0,0],
    # 4 pages per lane: lane 0 is short (needs 4, has 3).
    alloc = OwnerLaneAllocator(CPConfig(4, 64, "rotation"), 4)
    before = snapshot(alloc)
    with pytest.raises(LaneExhausted, match=r"lane 0 .*needs 4 pages.*only 3 are free") as info:
        alloc.alloc_extend([0], [1000], [-1])
    assert (info.value.lane, info.value.needed, info.value.available) == (0, 4, 3)
    assert snapshot(alloc) == before


@pytest.mark.clause("C-ATOMIC")
def test_batch_is_all_or_nothing():
    # C=4, P=64, Q=8: usable [7, 8, 8, 8]. Two fresh 1000-token requests (phases 0 and 1) need 4 + 4 = 8
    # pages on every lane; lane 0 has 7 -> LaneExhausted(0, 8, 7) and the first request takes nothing:
    # afterwards the single request still gets exactly the SPEC example's pages.
    alloc = OwnerLaneAllocator(CPConfig(4, 64, "rotation"), 8)
    before = snapshot(alloc)
    with pytest.raises(LaneExhausted) as info:
        alloc.alloc_extend([0, 0], [1000, 1000], [-1, -1])
    assert (info.value.lane, info.value.needed, info.value.available) == (0, 8, 7)
    assert snapshot(alloc) == before
    res = alloc.alloc_extend([0], [1000], [-1])
    assert res.new_pages.tolist() == [4, 8, 1, 5, 2, 6, 3, 7, 11, 15, 10, 14, 9, 13, 12, 16]


@pytest.mark.clause("C-ATOMIC")
def test_alloc_pages_is_all_or_nothing():
    alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 3)  # usable [2, 3]
    before = snapshot(alloc)
    with pytest.raises(LaneExhausted) as info:
        alloc.alloc_pages([1, 0, 1, 0, 0])
    assert (info.value.lane, info.value.needed, info.value.available) == (0, 3, 2)
    assert snapshot(alloc) == before
    with pytest.raises(AllocatorError, match=r"owners\[1\]=2 out of range \[0, 2\)"):
        alloc.alloc_pages([0, 2])
    with pytest.raises(AllocatorError, match=r"owners\[0\]=-1"):
        alloc.alloc_pages([-1])
    assert snapshot(alloc) == before


@pytest.mark.clause("C-ATOMIC")
def test_exhaustion_after_use_reports_current_free_count():
    alloc = used_allocator()  # lane 0 free 7 - 1 = 6
    before = snapshot(alloc)
    with pytest.raises(LaneExhausted) as info:
        alloc.alloc_pages([0] * 7)
    assert (info.value.lane, info.value.needed, info.value.available) == (0, 7, 6)
    assert snapshot(alloc) == before


# ----------------------------------------------------------------------------------------------------
# free
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-ALLOC")
@pytest.mark.parametrize(
    ("pages", "match"),
    [
        ([0], r"page 0"),
        ([4, 0], r"page 0"),  # a valid page with page 0: nothing is freed
        ([2], r"page 2: it is already free"),
        ([4, 2], r"page 2: it is already free"),
        ([32], r"page id 32 out of range \[0, 32\)"),
        ([-1], r"page id -1 out of range"),
        ([1, 99], r"page id 99 out of range"),
        ([4, 4], r"page 4: listed more than once"),
        ([1, 4, 1], r"page 1: listed more than once"),
        ([1.0], r"integers"),
    ],
)
def test_bad_free_raises_and_changes_nothing(pages, match):
    alloc = used_allocator()  # held: 4, 1
    before = snapshot(alloc)
    with pytest.raises(AllocatorError, match=match):
        alloc.free(pages)
    assert snapshot(alloc) == before
    assert not alloc.is_free([4, 1]).any()


@pytest.mark.clause("C-ALLOC")
def test_free_beyond_lane_capacity():
    # Q_r = [2, 4]: lane 0 has pages 0, 2 (local 2 = page 4 does not exist), lane 1 has 1, 3, 5, 7.
    alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), [2, 4])
    alloc.alloc_pages([0, 1])
    before = snapshot(alloc)
    with pytest.raises(AllocatorError, match=r"page 4: beyond lane 0's capacity"):
        alloc.free([4])
    assert snapshot(alloc) == before


@pytest.mark.clause("C-ALLOC")
def test_valid_free_accepts_numpy_and_tensor():
    alloc = used_allocator()
    alloc.free(torch.tensor([4]))
    alloc.free(np.array([1]))
    alloc.free([])
    assert alloc.free_pages_per_lane().tolist() == [7, 8, 8, 8]


# ----------------------------------------------------------------------------------------------------
# C-FAIL-FAST: bad alloc_extend / alloc_decode input
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-FAIL-FAST")
@pytest.mark.parametrize(
    ("prefix_lens", "extend_lens", "last_locs", "error", "match"),
    [
        # (last_loc + 1) % P must equal prefix_len % P: (18 + 1) % 4 = 3 but 6 % 4 = 2 (and 4 % 4 = 0).
        (
            [0, 6],
            [1, 1],
            [-1, 18],
            AllocatorError,
            r"request 1: last_loc=18 is inconsistent with prefix_len=6",
        ),
        ([4], [1], [18], AllocatorError, r"request 0: last_loc=18 is inconsistent with prefix_len=4"),
        # prefix_len 0 needs last_loc -1.
        ([0], [3], [5], AllocatorError, r"request 0: prefix_len=0 needs last_loc=-1, got 5"),
        ([6, 0], [1, 2], [5, 7], AllocatorError, r"request 1: prefix_len=0 needs last_loc=-1, got 7"),
        # prefix_len > 0 with last_loc -1 (or on page 0, or beyond the pool).
        ([4], [1], [-1], AllocatorError, r"request 0: last_loc=-1 out of range"),
        ([4], [1], [3], AllocatorError, r"request 0: last_loc=3 out of range"),
        ([4], [1], [128 * 4 + 3], AllocatorError, r"request 0: last_loc=515 out of range"),
        # last_loc on a free page: slot 11 is on page 2 (lane 2), never allocated.
        ([4], [1], [11], AllocatorError, r"request 0: last_loc=11 lies on page 2, which is free"),
        ([6, 8], [1, 1], [5, 11], AllocatorError, r"request 1: last_loc=11 lies on page 2"),
        # negative lengths.
        ([0, -3], [1, 1], [-1, -1], PlanError, r"request 1: prefix_len=-3 must be >= 0"),
        ([0, 0], [2, -1], [-1, -1], PlanError, r"request 1: extend_len=-1 must be >= 0"),
        # mismatched array lengths.
        ([0, 0], [1], [-1, -1], PlanError, r"extend_lens has 1 entries but prefix_lens has 2"),
        ([0, 0], [1, 1], [-1], PlanError, r"last_locs has 1 entries but prefix_lens has 2"),
        ([0], [1], [-1, -1], PlanError, r"last_locs has 2 entries"),
    ],
)
def test_bad_extend_input_raises_named_value_error(prefix_lens, extend_lens, last_locs, error, match):
    alloc = used_allocator()  # held pages 4 (slots 16..19) and 1 (slots 4..7; request A ends at slot 5)
    before = snapshot(alloc)
    with pytest.raises(error, match=match) as info:
        alloc.alloc_extend(prefix_lens, extend_lens, last_locs)
    assert isinstance(info.value, ValueError)
    assert snapshot(alloc) == before


@pytest.mark.clause("C-FAIL-FAST")
@pytest.mark.parametrize(
    ("seq_lens", "last_locs", "error", "match"),
    [
        ([6], [6], AllocatorError, r"request 0: last_loc=6 is inconsistent with prefix_len=6"),
        ([0], [5], AllocatorError, r"prefix_len=0 needs last_loc=-1"),
        ([6, 4], [5, 9], AllocatorError, r"request 1: last_loc=9 is inconsistent with prefix_len=4"),
        ([6, -1], [5, -1], PlanError, r"request 1: prefix_len=-1 must be >= 0"),
        ([6, 6], [5], PlanError, r"last_locs has 1 entries"),
        ([8], [11], AllocatorError, r"last_loc=11 lies on page 2, which is free"),
    ],
)
def test_bad_decode_input_raises_named_value_error(seq_lens, last_locs, error, match):
    alloc = used_allocator()
    before = snapshot(alloc)
    with pytest.raises(error, match=match):
        alloc.alloc_decode(seq_lens, last_locs)
    assert snapshot(alloc) == before


@pytest.mark.clause("C-FAIL-FAST")
def test_valid_continuation_is_accepted_after_rejections():
    # Control: the same allocator accepts the consistent continuation of request A (L0=6, last_loc=5):
    # 2 head slots 6, 7 (page 1), then m = ceil(10/4) - ceil(6/4) = 3 - 2 = 1 page, phase (6//4 + 0) % 4 = 1
    # -> lane 1, next free page 5 -> slots 20, 21.
    alloc = used_allocator()
    res = alloc.alloc_extend([6], [4], [5])
    assert res.out_cache_loc.tolist() == [6, 7, 20, 21]
    assert res.new_pages.tolist() == [5]


@pytest.mark.clause("C-FAIL-FAST")
@pytest.mark.parametrize(("prefix_len", "last_loc"), [(3, 18), (4, 19)])
def test_last_loc_on_a_page_beyond_its_lane_capacity_is_rejected(prefix_len, last_loc):
    # Q_r = [2, 4], P=4: page ids run over 0 .. 7, but lane 0 holds only pages 0 and 2; page 4 (slots
    # 16..19) is lane 0's local page 2 >= Q_0 and does not exist. A last_loc there names no held page:
    # the call must fail like a last_loc on a free page, and nothing changes. (Accepted, L0=3 and
    # last_loc=18 would give the head token slot 19, whose write slot (4 // 2) * 4 + 3 = 11 lies past
    # lane 0's 2 * 4 = 8 rows.)
    alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), [2, 4])
    before = snapshot(alloc)
    with pytest.raises(
        AllocatorError, match=rf"request 0: last_loc={last_loc} lies on page 4, which does not exist"
    ):
        alloc.alloc_extend([prefix_len], [1], [last_loc])
    assert snapshot(alloc) == before


@pytest.mark.clause("C-ATOMIC")
def test_failed_device_transfer_allocates_nothing(monkeypatch):
    # The allocator's pages are committed only when the whole call succeeds, including building
    # out_cache_loc on the device. Simulate the device copy failing (e.g. CUDA out of memory); "meta" is
    # a device other than the host that exists on every machine (a CPU allocator copies nothing).
    alloc = OwnerLaneAllocator(CPConfig(4, 64, "rotation"), 8, device="meta")
    before = snapshot(alloc)

    def failing_to(self, *args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(torch.Tensor, "to", failing_to)
    with pytest.raises(RuntimeError, match="simulated"):
        alloc.alloc_extend([0], [1000], [-1])
    monkeypatch.undo()
    assert snapshot(alloc) == before


@pytest.mark.clause("C-FAIL-FAST")
def test_unusable_device_is_a_config_error():
    with pytest.raises(ConfigError, match="device='nonsense'"):
        OwnerLaneAllocator(CPConfig(4, 64, "rotation"), 8, device="nonsense")
