"""The allocator writes ``out_cache_loc`` with the Triton kernel when its device takes a kernel path (here
the CPU under Triton's interpreter), with exactly the integers of the numpy path (SPEC C-ALLOC, C-KERNEL)."""

import numpy as np
import pytest

from cpkv import CPConfig, LaneExhausted, OwnerLaneAllocator

pytest.importorskip("triton", reason="Triton is not installed: `pip install -e '.[gpu]'` (make test does)")
pytestmark = [pytest.mark.unit, pytest.mark.clause("C-KERNEL")]


@pytest.mark.clause("C-ALLOC")
def test_spec_example_through_the_kernel(launches):
    # SPEC section 7: C=4, P=64, Q=8, fresh, L0=0, E=1000: pages [4, 8, 1, ...] -> 256..319, 512..575, 64..127.
    a = OwnerLaneAllocator(CPConfig(4, 64, "rotation"), 8).alloc_extend([0], [1000], [-1])
    assert a.new_pages.tolist() == [4, 8, 1, 5, 2, 6, 3, 7, 11, 15, 10, 14, 9, 13, 12, 16]
    assert a.out_cache_loc[:192].tolist() == [*range(256, 320), *range(512, 576), *range(64, 128)]
    assert launches["fill_out_cache_loc_kernel"] == 1


@pytest.mark.parametrize("policy", ["rotation", "legacy", "balanced"])
def test_chunked_prefills_and_decodes_equal_the_numpy_path(monkeypatch, policy):
    # Two allocators replay the same calls: one on the kernel path, one with CPKV_KERNELS=off.
    kernel = OwnerLaneAllocator(CPConfig(4, 16, policy), 40)
    monkeypatch.setenv("CPKV_KERNELS", "off")
    numpy_path = OwnerLaneAllocator(CPConfig(4, 16, policy), 40)
    monkeypatch.delenv("CPKV_KERNELS")
    assert kernel._kernels and not numpy_path._kernels
    rng = np.random.default_rng(len(policy))
    seq = [[0, -1] for _ in range(5)]  # per request: tokens cached, last_loc
    for _ in range(12):
        reqs = sorted(rng.choice(5, size=rng.integers(1, 4), replace=False).tolist())
        L0 = [seq[i][0] for i in reqs]
        E = rng.integers(0, 40, len(reqs)).tolist()
        last = [seq[i][1] for i in reqs]
        try:
            a = kernel.alloc_extend(L0, E, last)
        except LaneExhausted:
            with pytest.raises(LaneExhausted):
                numpy_path.alloc_extend(L0, E, last)
            continue
        b = numpy_path.alloc_extend(L0, E, last)
        assert a.out_cache_loc.tolist() == b.out_cache_loc.tolist()
        assert a.new_pages.tolist() == b.new_pages.tolist()
        assert kernel.state_digest() == numpy_path.state_digest()
        ends = np.cumsum(E)
        for k, i in enumerate(reqs):
            if E[k]:
                seq[i] = [L0[k] + E[k], int(a.out_cache_loc[ends[k] - 1])]
