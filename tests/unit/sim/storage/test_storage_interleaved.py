"""The interleaved design (SPEC C-STORAGE): position page j of a request on lane ``(b + j) % C``, its own
start lane b, across its chunks and batch mates; the compute plan stays the group's."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.sim.config import SimConfig

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]


def test_interleaved_places_position_page_j_on_rank_b_plus_j(build_design):
    # C=4, P=1, Q=4: free [3, 4, 4, 4]. Two fresh requests of 3 and 2 tokens in one batch: the first starts on
    # the lane with the most free pages (lane 1, the lower of the ties), the second on lane 0 (free [3, 3, 3, 3]
    # after the first). The compute plan stays the zigzag (rotation phases 0 and 1): storage is not compute.
    s = build_design("interleaved", SimConfig(cp_size=4, page_size=1, pages_per_lane=4))
    plan = s.alloc.plan_extend([0, 0], [3, 2], [-1, -1])
    assert plan.page_owners.tolist() == [1, 2, 3, 0, 1]
    assert plan.token_owner.tolist() == [0, 1, 2, 1, 2]
    a = s.alloc.allocate(plan, [-1, -1])
    assert (a.new_pages % 4).tolist() == [
        1,
        2,
        3,
        0,
        1,
    ] and a.out_cache_loc_cpu.tolist() == a.new_pages.tolist()
    # a later chunk of the first request continues its rotation after its last page (lane 3): lanes 0, 1
    nxt = s.alloc.alloc_extend([3], [2], [int(a.out_cache_loc_cpu[2])])
    assert (nxt.new_pages % 4).tolist() == [0, 1]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.sampled_from([1, 2, 3]), st.data())
def test_interleaved_pages_of_a_request_are_cyclic_over_its_chunks(build_design, C, P, data):
    # every request's position-pages lie on (b + j) % C for its own b, however its chunks and batch mates fall
    s = build_design("interleaved", SimConfig(cp_size=C, page_size=P, pages_per_lane=400))
    lengths = data.draw(st.lists(st.integers(1, 12 * P), min_size=1, max_size=5))
    done, slots = [0] * len(lengths), [[] for _ in lengths]
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        batch = [i for i, (d, n) in enumerate(zip(done, lengths, strict=True)) if d < n]
        ext = [min(lengths[i] - done[i], data.draw(st.integers(1, 4 * P))) for i in batch]
        a = s.alloc.alloc_extend(
            [done[i] for i in batch], ext, [slots[i][-1] if slots[i] else -1 for i in batch]
        )
        out = a.out_cache_loc_cpu.tolist()
        for i, n in zip(batch, ext, strict=True):
            slots[i] += out[:n]
            out = out[n:]
            done[i] += n
    for row in slots:
        lanes = [slot // P % C for slot in row[::P]]
        assert lanes == [(lanes[0] + j) % C for j in range(len(lanes))]
        assert [slot // P for slot in row] == [row[t - t % P] // P for t in range(len(row))]  # one page per P
