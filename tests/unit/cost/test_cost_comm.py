"""Communication prices (cpkv.cost.comm, SPEC C-COST): which measured message each call reads, without
aiconfigurator (a made-up affine NCCL table: 5 us + 1 ns per element per GPU)."""

import numpy as np
import pytest

from cpkv.cost.comm import COLLECTIVES, CommCost
from cpkv.cost.spec import CostModelError

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-COST")]


def _affine(calls):
    def sample(op, num_gpus, elements):
        calls.append((op, num_gpus))
        return 0.005 + 1e-6 * num_gpus * elements * (1 + COLLECTIVES.index(op))

    return sample


def _ref(op, num_gpus, elements):  # the made-up table, read directly
    return 0.005 + 1e-6 * num_gpus * elements * (1 + COLLECTIVES.index(op))


def test_collectives_read_the_whole_buffer_in_16_bit_elements():
    calls = []
    comm = CommCost(_affine(calls))
    # an all-gather of 8 x 1 MiB: a whole buffer of 8 MiB = 4 Mi elements
    assert comm.allgather_ms(2**20, 8) == pytest.approx(_ref("all_gather", 8, 8 * 2**20 / 2))
    assert comm.reduce_scatter_ms(2**20, 4) == pytest.approx(_ref("reduce_scatter", 4, 4 * 2**20 / 2))
    assert comm.allreduce_ms(3 * 2**20, 2) == pytest.approx(_ref("all_reduce", 2, 3 * 2**20 / 2))
    # remote reads: every rank receives nbytes, nbytes / (C - 1) from each peer
    assert comm.remote_read_ms(7 * 2**20, 8) == pytest.approx(comm.allgather_ms(2**20, 8))
    assert comm.p2p_ms(2**20) == pytest.approx(_ref("all_gather", 2, 2 * 2**20 / 2))
    comm.allgather_ms(5, 8)
    assert calls == [("all_gather", 8), ("reduce_scatter", 4), ("all_reduce", 2), ("all_gather", 2)]  # kept


def test_nothing_moves_nothing_costs_and_arrays_work():
    comm = CommCost(_affine([]))
    assert comm.allgather_ms(10**6, 1) == 0.0 and comm.remote_read_ms(10**6, 1) == 0.0
    assert comm.allgather_ms(0, 8) == 0.0
    sizes = np.array([0, 1, 2**10, 2**20, 2**32])  # the last past the sampled sizes: the last slope goes on
    out = comm.allgather_ms(sizes, 8)
    assert out.shape == (5,) and out[0] == 0.0 and np.all(np.diff(out) > 0)
    assert out[-1] == pytest.approx(_ref("all_gather", 8, 8 * 2**32 / 2))


def test_sampler_errors_and_bad_ops_surface():
    def missing(op, num_gpus, elements):
        raise CostModelError(f"aiconfigurator cannot price NCCL {op} over {num_gpus} GPUs: no data")

    with pytest.raises(CostModelError, match="over 3 GPUs"):
        CommCost(missing).allgather_ms(1024, 3)
    with pytest.raises(ValueError, match="alltoall"):
        CommCost(_affine([])).curve("alltoall", 8)
