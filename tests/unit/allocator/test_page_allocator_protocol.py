"""``PageAllocator``: every storage design's allocator and ``OwnerLaneAllocator`` satisfy it, and its members
are exactly what the simulator's scheduler calls (SPEC C-ALLOC, C-STORAGE; REVIEW change 2)."""

import ast
from pathlib import Path

import numpy as np
import pytest

import cpkv
from cpkv import CPConfig, OwnerLaneAllocator
from cpkv.allocator import PageAllocator
from cpkv.sim.config import KV_STORAGE_DESIGNS, SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.storage import build_storage

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ALLOC", "C-STORAGE")]

SRC = Path(cpkv.__file__).parent

# Where the scheduler reaches the allocator: ``<x>.alloc.<member>`` in the step builder, the speculative
# decoder, the engine and its metrics; ``scratch.<member>`` in the liveness rules; the request flow's
# ``allocator.<member>`` (the engine hands it its allocator).
SCHEDULER = {
    "sim/admission.py": "alloc",
    "sim/spec_decode.py": "alloc",
    "sim/engine.py": "alloc",
    "sim/metrics.py": "alloc",
    "sim/reservation.py": "scratch",
    "cache/flow.py": "allocator",
}


def _members_used(path: Path, name: str) -> set[str]:
    """``m`` of every ``<obj>.<name>.m`` (and of ``<name>.m`` where ``name`` is not ``alloc``, which the engine
    also names a step's ``ExtendAllocation``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if (isinstance(v, ast.Attribute) and v.attr == name) or (
            name != "alloc" and isinstance(v, ast.Name) and v.id == name
        ):
            out.add(node.attr)
    return out


def _protocol_members() -> set[str]:
    return {n for n in vars(PageAllocator) if not n.startswith("_")} | set(PageAllocator.__annotations__)


def test_the_protocol_lists_exactly_the_calls_the_scheduler_makes():
    used = set().union(*(_members_used(SRC / f, name) for f, name in SCHEDULER.items()))
    assert used == _protocol_members()
    assert _protocol_members() == {
        "alloc_draft",
        "alloc_extend",
        "alloc_pages",
        "allocate",
        "capacity_per_lane",
        "free",
        "free_pages_per_lane",
        "num_pages",
        "page_size",
        "plan_current",
        "plan_extend",
        "release_tail",
        "replans_after_eviction",
        "total_free_pages",
        "used_pages_per_lane",
    }


@pytest.mark.parametrize("design", KV_STORAGE_DESIGNS)
@pytest.mark.parametrize("policy", ["rotation", "legacy", "balanced"])
def test_every_design_allocator_and_its_scratch_are_page_allocators(design, policy):
    cfg = SimConfig(cp_size=4, page_size=2, pages_per_lane=[9, 7, 8, 9])
    storage = build_storage(design, cfg, policy, PolicyRun(cfg, policy, []).cost)
    for alloc in (storage.alloc, storage.scratch_allocator()):
        assert isinstance(alloc, PageAllocator)
        assert all(hasattr(alloc, m) for m in _protocol_members())
        assert alloc.page_size == storage.page_size
        assert alloc.free_pages_per_lane().tolist() == alloc.capacity_per_lane.tolist()
    scratch = storage.scratch_allocator()
    assert scratch is not storage.alloc and type(scratch) is type(storage.alloc)


def test_owner_lane_allocators_of_both_pool_kinds_are_page_allocators():
    sharded = OwnerLaneAllocator(CPConfig(4, 8, "balanced"), 6)
    replicated = OwnerLaneAllocator(CPConfig(4, 8, "rotation"), 6, kind="replicated")
    assert isinstance(sharded, PageAllocator) and isinstance(replicated, PageAllocator)
    assert (sharded.page_size, replicated.page_size) == (8, 8)
    assert (sharded.replans_after_eviction, replicated.replans_after_eviction) == (True, False)
    assert not isinstance(object(), PageAllocator)


@pytest.mark.parametrize("design", KV_STORAGE_DESIGNS)
def test_alloc_draft_is_alloc_extend_with_k_tokens_each(design):
    # C-DRAFT in every design's pages: the same slots and pages as alloc_extend(seq_lens, [k] * B) on a twin
    cfg = SimConfig(cp_size=2, page_size=2, pages_per_lane=16)
    one, two = (build_storage(design, cfg, "rotation", PolicyRun(cfg, "rotation", []).cost) for _ in range(2))
    a = one.alloc.alloc_draft([0, 0], [-1, -1], 3)
    b = two.alloc.alloc_extend([0, 0], [3, 3], [-1, -1])
    assert a.out_cache_loc_cpu.tolist() == b.out_cache_loc_cpu.tolist()
    assert np.array_equal(a.new_pages, b.new_pages) and a.out_cache_loc_cpu.shape == (6,)
    with pytest.raises(cpkv.AllocatorError, match="num_draft_tokens"):
        one.alloc.alloc_draft([4], [int(a.out_cache_loc_cpu[2])], 0)
