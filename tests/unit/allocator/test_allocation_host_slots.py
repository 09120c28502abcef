"""``ExtendAllocation.out_cache_loc_cpu`` (numpy) and ``out_cache_loc`` (torch) hold the same slots (C-ALLOC).

A CPU allocator keeps the slots as numpy and wraps them as a tensor on first read, so code that reads only
numpy (the simulator) never imports torch; every other device gets a torch tensor there, as before.
"""

import pickle

import numpy as np
import pytest
import torch

from cpkv import CPConfig, OwnerLaneAllocator

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-ALLOC")]


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
@pytest.mark.parametrize(("L0", "E"), [([0, 0], [100, 70]), ([0], [1])])  # general and single-page paths
def test_cpu_slots_are_one_array_seen_two_ways(device, L0, E):
    alloc = OwnerLaneAllocator(CPConfig(4, 16, "balanced"), 64, device=device)
    assert alloc.device == torch.device("cpu")
    a = alloc.alloc_extend(L0, E, [-1] * len(L0))
    host = a.out_cache_loc_cpu
    assert type(host) is np.ndarray and host.dtype == np.int64 and host.shape == (sum(E),)
    tensor = a.out_cache_loc
    assert tensor.dtype == torch.int64 and tensor.device.type == "cpu"
    assert a.out_cache_loc is tensor  # wrapped once
    assert np.shares_memory(tensor.numpy(), a.out_cache_loc_cpu)
    np.testing.assert_array_equal(tensor.numpy(), host)
    assert np.unique(host // 16).tolist() == sorted(a.new_pages.tolist())


def test_other_devices_hold_a_tensor_and_copy_to_the_host():
    alloc = OwnerLaneAllocator(CPConfig(2, 4), 16, device="meta")
    ref = OwnerLaneAllocator(CPConfig(2, 4), 16)
    a, b = alloc.alloc_extend([0], [10], [-1]), ref.alloc_extend([0], [10], [-1])
    assert a.out_cache_loc.device.type == "meta" and alloc.device == torch.device("meta")
    np.testing.assert_array_equal(a.new_pages, b.new_pages)
    assert "device=meta" in repr(a) and "device=cpu" in repr(b)


def test_pickle_round_trip_keeps_the_slots():
    a = OwnerLaneAllocator(CPConfig(2, 4), 16).alloc_extend([0, 0], [5, 9], [-1, -1])
    b = pickle.loads(pickle.dumps(a))
    np.testing.assert_array_equal(b.out_cache_loc_cpu, a.out_cache_loc_cpu)
    assert torch.equal(b.out_cache_loc, a.out_cache_loc)
