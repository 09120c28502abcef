"""``cpkv.integrations.cpu_stubs``: the torchvision stand-in SGLang needs on a CPU-only machine.

Each case runs in a fresh interpreter so that no stub leaks into this test process.
"""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit


def run(code: str, tmp_path, fake_torchvision: str | None = None) -> str:
    if fake_torchvision is not None:
        (tmp_path / "torchvision").mkdir()
        (tmp_path / "torchvision" / "__init__.py").write_text(fake_torchvision)
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


STUB_PROBE = """
    import importlib.util, sys
    from cpkv.integrations.cpu_stubs import TORCHVISION_MODULES, install_torchvision_stub
    print(install_torchvision_stub())
    import torchvision
    from torchvision.transforms import v2
    from torchvision.ops import nms
    print(torchvision.__version__, importlib.util.find_spec("torchvision") is not None, all(m in sys.modules for m in TORCHVISION_MODULES))
    print(type(nms(1, 2)).__name__, type(v2.functional.resize).__name__, hasattr(torchvision, "__path__"))
"""


def test_stub_stands_in_when_torchvision_does_not_import(tmp_path):
    broken = "raise RuntimeError('operator torchvision::nms does not exist')"
    out = run(STUB_PROBE, tmp_path, fake_torchvision=broken).splitlines()
    assert out == ["True", "0.28.0 True True", "_Inert _Inert False"]


def test_a_working_torchvision_is_kept(tmp_path):
    out = run(
        STUB_PROBE.split("import torchvision\n")[0] + "import torchvision; print(torchvision.REAL)",
        tmp_path,
        fake_torchvision="REAL = 'yes'",
    ).splitlines()
    assert out == ["False", "yes"]
