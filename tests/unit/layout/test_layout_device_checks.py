"""Layout translations refuse meta tensors with a typed error and check ranges without a device sync
(SPEC C-LAYOUT). Off the host the range check is queued on the device
(``torch._assert_async``); here the device path runs on CPU tensors (``_on_host`` patched), where that
assert raises at once, with every host read of a tensor value forbidden."""

import numpy as np
import pytest
import torch

from cpkv import SharedKVLayout
from cpkv import layout as layout_mod
from cpkv.errors import LayoutError

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-LAYOUT")]

LAYOUT = SharedKVLayout(4, 64, 8)
SLOTS = [0, 63, 64, 65, 128, 197, 512, -1]
WANT = {
    "read_slots": [0, 63, 512, 513, 1024, 1541, 128, -1],
    "write_slots": [0, 63, 0, 1, 0, 5, 128, -1],
    "lane_of": [0, 0, 1, 1, 2, 3, 0, -1],
}


@pytest.mark.parametrize(
    ("kind", "fn"),
    [
        ("sharded", "read_slots"),
        ("sharded", "write_slots"),
        ("sharded", "lane_of"),
        ("sharded", "owned_mask"),
        ("replicated", "read_slots"),
        ("replicated", "write_slots"),
    ],  # a replicated pool has no owner translations
)
def test_a_meta_tensor_is_refused_with_a_layout_error(fn, kind):
    layout = SharedKVLayout(4, 64, 8, kind=kind)
    args = (0,) if fn == "owned_mask" else ()
    with pytest.raises(
        LayoutError, match=r"slots are a meta tensor \(8,\) torch.int64: it holds no slot values"
    ):
        getattr(layout, fn)(torch.empty(8, dtype=torch.int64, device="meta"), *args)


class _NoHostReads:
    """Forbid every read of a tensor value on the host (what a device sync would be on CUDA)."""

    NAMES = ("item", "tolist", "__int__", "__bool__", "__index__", "__float__", "numpy")

    def __init__(self, monkeypatch):
        for name in self.NAMES:
            monkeypatch.setattr(torch.Tensor, name, self._refuse(name), raising=False)

    @staticmethod
    def _refuse(name):
        def refuse(*args, **kwargs):
            raise AssertionError(f"Tensor.{name}: a host read of a device value (a sync)")

        return refuse


@pytest.fixture
def device_path(monkeypatch):
    """CPU tensors take the device path (no host check, a queued assert)."""
    monkeypatch.setattr(layout_mod, "_on_host", lambda tensor: False)


@pytest.mark.parametrize("fn", sorted(WANT))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_the_device_path_translates_without_a_host_read(fn, dtype, device_path, monkeypatch):
    slots = torch.tensor(SLOTS, dtype=dtype)
    out = torch.empty_like(slots)
    with monkeypatch.context() as m:
        _NoHostReads(m)
        got = getattr(LAYOUT, fn)(slots)
        into = getattr(LAYOUT, fn)(slots, out=out)
        unchecked = getattr(LAYOUT, fn)(slots, check=False)
    assert got.dtype == dtype and into is out
    for res in (got, out, unchecked):
        assert res.tolist() == WANT[fn]


def test_the_device_path_queues_the_range_check_and_check_false_skips_it(device_path, monkeypatch):
    bad = torch.tensor([0, LAYOUT.num_slots], dtype=torch.int64)  # one past the last slot
    with monkeypatch.context() as m:
        _NoHostReads(m)
        with pytest.raises(RuntimeError, match="a slot out of range: the pool has 2048 slots"):
            LAYOUT.read_slots(bad)  # the CPU's _assert_async raises at once; CUDA's at the next sync
        LAYOUT.read_slots(bad, check=False)  # the caller vouches: no check at all
    with pytest.raises(
        RuntimeError, match="does not fit torch.int16"
    ):  # the result's dtype, checked there too
        SharedKVLayout(4, 64, 200).read_slots(torch.tensor([3 * 64], dtype=torch.int16))  # row 38,400


def test_on_the_host_the_check_is_the_typed_error_whatever_check_says():
    for slots in (np.array([LAYOUT.num_slots]), torch.tensor([LAYOUT.num_slots])):
        for check in (True, False):
            with pytest.raises(LayoutError, match="slot 2048 out of range: the pool has 2048 slots"):
                LAYOUT.read_slots(slots, check=check)


def test_the_device_range_check_compares_in_int64(device_path):
    # 51,200 slots do not fit int16: a narrow dtype's slots are compared as int64, so slot 25,601 passes
    layout = SharedKVLayout(4, 64, 200)
    assert layout.write_slots(torch.tensor([25_601], dtype=torch.int16)).tolist() == [6401]
