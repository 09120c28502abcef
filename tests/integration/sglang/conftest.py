"""SGLang 0.5.23 on the CPU for tests/integration/sglang (docs/sglang.md, ``make test-sglang``).

Where sglang is installed, the torchvision stub goes in before any test module imports sglang (SGLang
imports torchvision at module level and no registry build of it imports with CPU torch 2.13; see
``cpkv.integrations.cpu_stubs``). Without sglang nothing is stubbed and the tests here skip
(``pytest.importorskip``).

``CPKV_REQUIRE_SGLANG=1`` (set by ``make test-sglang``) turns a failing ``import sglang`` into a collection
error, so the SGLang tests can never all skip unnoticed in CI.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

from cpkv.integrations.cpu_stubs import install_torchvision_stub

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared workload helpers of this folder

try:  # the installed distribution: this folder, on sys.path for pytest, is named sglang too
    importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:
    pass
else:
    install_torchvision_stub()

if os.environ.get("CPKV_REQUIRE_SGLANG") == "1":
    import cpkv.integrations.sglang  # noqa: F401  (fails collection loudly when SGLang does not import)


@pytest.fixture(autouse=True)
def _sglang_runtime_context_reset():
    """Each test leaves SGLang's runtime context empty: a test that publishes server args (an engine loop,
    a HiCache engine) would otherwise leave its topology to a later test's ``get_parallel().override``,
    which SGLang then finds inconsistent (``tp_size == moe_ep_size * moe_dp_size * moe_tp_size``)."""
    yield
    context = sys.modules.get("sglang.srt.runtime_context")
    if context is not None:
        context.reset_context()
