"""benchmarks/bench_kernels.py's ``cuda_ms`` reports device time even where a launch takes the host longer
than the kernel takes the device (below 16M tokens its figures were once the host's launch time).

Seen on an H200 (2026-11-30): fill_out_cache_loc's kernel at 1M tokens timed 35 us with the calls queued
back to back, 11.6 us with the stream held busy while they were queued; the host's launch took 24 us. With
an idle stream each start event fires as it is recorded, so the host's launch lands inside the interval.
Here a model of one CUDA stream (events and kernels in stream order, a host clock) replaces ``torch.cuda``.
"""

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


class _Stream:
    """One CUDA stream against a host clock (us): work starts once the host has queued it and the work
    queued before it has finished; ``synchronize`` waits for the stream. ``_sleep`` runs at 1 cycle/us."""

    def __init__(self, launch_us: float, kernel_us: float) -> None:
        self.host = self.tail = 0.0
        self.launch_us, self.kernel_us = launch_us, kernel_us

    def _enqueue(self, us: float) -> float:
        self.tail = max(self.host, self.tail) + us
        return self.tail

    def kernel(self) -> None:  # the benchmarked call: host launch work, then the kernel on the stream
        self.host += self.launch_us
        self._enqueue(self.kernel_us)

    def synchronize(self) -> None:
        self.host = max(self.host, self.tail)

    def _sleep(self, cycles: int) -> None:
        self._enqueue(float(cycles))

    def Event(self, enable_timing: bool = False):  # noqa: N802 (torch.cuda.Event)
        stream = self

        class _Event:
            def record(self) -> None:
                self.at = stream._enqueue(0.0)

            def elapsed_time(self, end) -> float:
                return (end.at - self.at) / 1e3  # ms

        return _Event()


@pytest.mark.parametrize(("launch_us", "kernel_us"), [(24.0, 11.6), (18.0, 14.5), (16.0, 47.7)])
def test_cuda_ms_is_the_device_time_of_the_call(monkeypatch, launch_us, kernel_us):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("bench_kernels", None)
    import bench_kernels

    stream = _Stream(launch_us, kernel_us)
    monkeypatch.setattr(bench_kernels.torch, "cuda", stream)
    assert bench_kernels.cuda_ms(stream.kernel, 20) * 1e3 == pytest.approx(kernel_us)
