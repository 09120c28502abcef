"""``out=`` buffers on ``cuda`` given without an index: the current CUDA device (C-KERNEL entry checks).

Found on an H200: ``fill_out_cache_loc(..., device="cuda", out=<tensor on cuda:0>)`` was refused because
``torch.device("cuda") != torch.device("cuda:0")``. The rule runs here with the current device stubbed.
"""

import pytest
import torch

from cpkv.kernels.tensors import same_device

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-KERNEL")]


@pytest.mark.parametrize("current", [0, 1])
def test_cuda_without_an_index_is_the_current_device(monkeypatch, current):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    assert same_device(torch.device("cuda"), torch.device("cuda", current))
    assert same_device(torch.device("cuda", current), torch.device("cuda"))
    assert not same_device(torch.device("cuda"), torch.device("cuda", 1 - current))
    assert same_device(torch.device("cuda"), torch.device("cuda"))


def test_other_devices_compare_as_they_are():
    assert same_device(torch.device("cpu"), torch.device("cpu"))
    assert not same_device(torch.device("cpu"), torch.device("meta"))
