"""The ``cpkv`` command starts light and aborts cleanly: nothing heavy is imported before a command needs it,
and a Ctrl-C while a command is still importing torch prints one line and exits 130."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.unit

_IMPORTED = """
import sys
import cpkv, cpkv.cli
cpkv.CPConfig  # light names stay light
print(",".join(m for m in ("torch", "matplotlib", "rich", "cpkv.executor", "cpkv.allocator") if m in sys.modules))
"""


def test_package_and_cli_import_without_torch():
    out = subprocess.run([sys.executable, "-c", _IMPORTED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_every_public_name_resolves():
    import cpkv

    assert sorted(cpkv.__all__) == sorted(cpkv._EXPORTS)
    for name in cpkv.__all__:
        assert getattr(cpkv, name) is not None
    assert "OwnerLaneAllocator" in dir(cpkv)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cpkv.nope  # noqa: B018


_SIMULATE = """
import sys
from cpkv.cli import main
try:
    main(["simulate", "--workload", "tiny-chunks-reload", "--max-requests", "24", "--policy", "all",
          "--spec-draft-tokens", "2", "--no-progress", "--cost-model", "illustrative", "--out", sys.argv[1]])
except SystemExit as e:
    assert e.code in (0, None), e.code
print(",".join(m for m in ("torch", "cpkv.executor", "cpkv.kernels.slots") if m in sys.modules))
"""


def test_simulate_never_imports_torch(tmp_path):
    # The simulator reads slots as numpy (ExtendAllocation.out_cache_loc_cpu); torch costs ~1 s of start-up.
    # This run takes the allocator, prefix cache with host tier and load-back, and draft pages (C-DRAFT).
    out = subprocess.run(
        [sys.executable, "-c", _SIMULATE, str(tmp_path / "sim")],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == ""  # the modules imported: none
    assert (tmp_path / "sim" / "report.json").is_file()


_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the test runner ignores SIGINT
from cpkv.cli import main
print("ready", flush=True)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ctrl_c_while_a_command_imports_torch_is_one_line():
    # run-dist imports torch and the executor only once the command is looked up (about a second or
    # more here); a SIGINT right after main() starts lands in that import.
    argv = ["run-dist", "--cp-size", "1", "--prefix-len", "0", "--extend-len", "8"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CPKV_KERNELS": "off"},
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert err.splitlines() == ["cpkv: aborted"]
