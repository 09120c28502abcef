"""SGLang 0.5.9 on the CPU for tests/integration/sglang059 (``make test-sglang``, in ``.venv-sglang059``).

As for 0.5.23 (tests/integration/sglang/conftest.py): the torchvision stand-in goes in before any test
imports sglang. The tests here skip unless the installed sglang is 0.5.9; ``CPKV_REQUIRE_SGLANG=1`` (set by
``make test-sglang``) turns a missing or other version, or a failing import, into a collection error.
"""

from __future__ import annotations

import importlib.metadata
import os

from cpkv.integrations.cpu_stubs import install_torchvision_stub

SGLANG_VERSION = "0.5.9"

try:
    installed = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:
    installed = None
else:
    install_torchvision_stub()

if os.environ.get("CPKV_REQUIRE_SGLANG") == "1":
    if installed != SGLANG_VERSION:
        raise RuntimeError(
            f"tests/integration/sglang059 needs sglang {SGLANG_VERSION}, found {installed} "
            "(make test-sglang runs them in .venv-sglang059)"
        )
    import sglang.srt.layers.attention.nsa.utils  # noqa: F401  (fails collection loudly when it does not import)
