"""Layout translations of CUDA slots never sync the device (SPEC C-LAYOUT): under
``torch.cuda.set_sync_debug_mode("error")`` every translation runs, and its range check is queued on the
device, where an out-of-range slot is a device-side assert at the next sync (run in a child process: the
assert leaves its CUDA context unusable). Skipped without CUDA."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from cpkv import SharedKVLayout

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.clause("C-LAYOUT"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
@pytest.mark.parametrize("fn", ["read_slots", "write_slots", "lane_of"])
def test_translations_of_cuda_slots_do_not_sync(fn, dtype):
    layout = SharedKVLayout(4, 16, 100)
    host = np.array([0, 15, 16, 17, 33, 1000, 6399, -1])
    want = getattr(layout, fn)(host).tolist()
    slots = torch.tensor(host, dtype=dtype, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = getattr(layout, fn)(slots)
        into = getattr(layout, fn)(slots, out=torch.empty_like(slots))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert got.device == slots.device and got.dtype == dtype
    assert got.tolist() == into.tolist() == want


def test_an_out_of_range_cuda_slot_fails_at_the_next_sync():
    code = (
        "import torch; from cpkv import SharedKVLayout; L = SharedKVLayout(4, 16, 100); "
        "L.read_slots(torch.tensor([0, 6400], device='cuda')); torch.cuda.synchronize()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "device-side assert" in proc.stderr, proc.stderr[-2000:]
