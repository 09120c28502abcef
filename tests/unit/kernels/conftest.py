"""The kernel unit tests run every Triton kernel on the CPU through Triton's interpreter (SPEC C-KERNEL).

Each test gets ``TRITON_INTERPRET=1`` (and no ``CPKV_KERNELS``) for its own duration only, so CPU tensors
take the interpreted kernels (``cpkv.kernels.backend``) and nothing leaks into other tests. ``launches``
counts the kernel launches a test makes, to show that a check really ran a kernel.
"""

from __future__ import annotations

from collections import Counter

import pytest

from cpkv.kernels import backend


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("CPKV_KERNELS", raising=False)


class _CountingModule:
    """Proxy of the interpreted kernel module: ``module.kernel[grid](...)`` counts one launch of ``kernel``."""

    def __init__(self, module, counts: Counter) -> None:
        self._module, self._counts = module, counts

    def __getattr__(self, name):
        kernel = getattr(self._module, name)
        counts = self._counts

        class _Launch:
            def __getitem__(self, grid):
                counts[name] += 1
                return kernel[grid]

        return _Launch()


@pytest.fixture
def launches(monkeypatch) -> Counter:
    """A Counter of kernel launches by kernel name, for the duration of the test."""
    counts: Counter = Counter()
    real = backend.kernel_module

    def counting(interpret: bool):
        return _CountingModule(real(interpret), counts)

    import cpkv.kernels.rerange as rerange
    import cpkv.kernels.slots as slots

    monkeypatch.setattr(slots, "kernel_module", counting)
    monkeypatch.setattr(rerange, "kernel_module", counting)
    return counts
