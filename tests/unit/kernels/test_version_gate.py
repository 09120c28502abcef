"""The version gate and the ``CPKV_KERNELS`` switch (SPEC C-KERNEL): one clear error naming found and
required versions; ``auto`` / ``off``; which path each device takes; ``import cpkv`` never imports Triton."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from cpkv import CPConfig, OwnerLaneAllocator
from cpkv.errors import ConfigError, KernelVersionError
from cpkv.kernels import KERNEL_ABI, TRITON_MINIMUM, gate, kernel_backend, require_kernel_version, use_kernels

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-KERNEL")]

REQUIRED = ".".join(map(str, TRITON_MINIMUM))


def test_installed_triton_passes_the_gate():
    pytest.importorskip(
        "triton", reason="Triton is not installed: `pip install -e '.[gpu]'` (make test does)"
    )
    import triton

    stack = require_kernel_version()
    assert stack.triton == triton.__version__ and stack.abi == KERNEL_ABI
    assert gate.parse_version(stack.triton) >= TRITON_MINIMUM


@pytest.mark.parametrize(
    ("found", "minimum", "message"),
    [
        (
            ("3.1.0", ""),
            1,
            rf"found triton 3\.1\.0 \(required >= {REQUIRED}\) and cpkv kernel ABI {KERNEL_ABI} \(required >= 1\); install",
        ),
        (
            (None, "import triton failed: ModuleNotFoundError: no"),
            1,
            r"found no usable triton \(import triton failed: ModuleNotFoundError: no\) \(required >= ",
        ),
        (
            ("9.0.0", ""),
            KERNEL_ABI + 1,
            rf"found triton 9\.0\.0 .* cpkv kernel ABI {KERNEL_ABI} \(required >= {KERNEL_ABI + 1}\); upgrade cpkv",
        ),
    ],
)
def test_one_error_names_found_and_required_versions(monkeypatch, found, minimum, message):
    monkeypatch.setattr(gate, "triton_version", lambda: found)
    with pytest.raises(KernelVersionError, match=message) as err:
        require_kernel_version(minimum)
    assert "CPKV_KERNELS=off" in str(err.value) or "upgrade cpkv" in str(err.value)


@pytest.mark.parametrize(("numpy_version", "passes"), [("2.4.1", False), ("2.3.5", True), ("1.26.4", True)])
def test_interpreter_floor_under_numpy_2_4(monkeypatch, numpy_version, passes):
    # Triton 3.5's interpreter fails under numpy >= 2.4 (a loop bound it passes as a one-element array).
    monkeypatch.setattr(gate, "triton_version", lambda: ("3.5.1", ""))
    monkeypatch.setattr(gate, "np", SimpleNamespace(__version__=numpy_version))
    assert require_kernel_version().triton == "3.5.1"  # compiled kernels: TRITON_MINIMUM applies
    if passes:
        assert require_kernel_version(interpreter=True).triton == "3.5.1"
    else:
        with pytest.raises(
            KernelVersionError,
            match=r"triton 3\.5\.1 \(required >= 3\.7\.0 for Triton's interpreter under numpy 2\.4\.1\)",
        ):
            require_kernel_version(interpreter=True)


@pytest.mark.parametrize("minimum", [0, -1, 1.5, "1", True])
def test_minimum_must_be_a_positive_integer(minimum):
    with pytest.raises(ConfigError, match="minimum kernel ABI must be an integer >= 1"):
        require_kernel_version(minimum)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("3.9.0", (3, 9, 0)), ("3.2.0+git4a3f", (3, 2, 0)), ("3.10", (3, 10, 0)), ("dev", (0, 0, 0))],
)
def test_parse_version(text, parsed):
    assert gate.parse_version(text) == parsed


def test_backend_per_device_and_mode(monkeypatch):
    monkeypatch.setattr(gate, "triton_version", lambda: ("3.9.0", ""))  # any device path, no GPU needed
    monkeypatch.delenv("TRITON_INTERPRET")
    assert kernel_backend("cpu") == "torch"
    assert kernel_backend(torch.device("cuda", 1)) == "triton"
    assert kernel_backend("meta") == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernel_backend("cpu") == "interpreter" and use_kernels("cpu")
    for off in ("off", " OFF "):
        monkeypatch.setenv("CPKV_KERNELS", off)
        assert kernel_backend("cpu") == "torch" and kernel_backend("cuda") == "torch"
    monkeypatch.setenv("CPKV_KERNELS", "")
    assert kernel_backend("cuda") == "triton"


@pytest.mark.parametrize("value", ["on", "triton", "0"])
def test_bad_switch_value_is_a_config_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("CPKV_KERNELS", value)
    with pytest.raises(
        ConfigError,
        match=rf"environment variable CPKV_KERNELS='{value}' is not a kernel mode; use one of auto, off",
    ):
        kernel_backend("cpu")
    with pytest.raises(ConfigError, match="CPKV_KERNELS"):
        OwnerLaneAllocator(CPConfig(2, 4), 4)


def test_a_kernel_device_without_triton_fails_at_start_up(monkeypatch):
    monkeypatch.setattr(gate, "triton_version", lambda: (None, "import triton failed: ModuleNotFoundError"))
    with pytest.raises(KernelVersionError, match="found no usable triton"):
        OwnerLaneAllocator(CPConfig(2, 4), 4)  # TRITON_INTERPRET=1: the CPU takes the kernel path
    monkeypatch.setenv("CPKV_KERNELS", "off")  # the way out the message names: the numpy path
    alloc = OwnerLaneAllocator(CPConfig(2, 4, "rotation"), 4)
    assert alloc.alloc_extend([0], [3], [-1]).out_cache_loc.tolist() == [
        8,
        9,
        10,
    ]  # lane 0's page 2 (0 is reserved)


def test_import_cpkv_does_not_import_triton():
    code = "import sys, cpkv, cpkv.kernels, cpkv.allocator; print('triton' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"
