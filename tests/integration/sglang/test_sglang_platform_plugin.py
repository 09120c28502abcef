"""cpkv's SGLang platform plugin: SGLang 0.5.23 finds it through the ``sglang.srt.platforms`` entry point,
and its ``get_paged_allocator_cls()`` is cpkv's allocator bound to ``CPKV_CP_SIZE`` / ``CPKV_OWNER_POLICY``.

SGLang resolves its platform once, while its own modules import (``kv_cache_configurator`` binds
``current_platform`` at import), so the end-to-end cases run in a fresh interpreter with the environment
set, as a server would start.
"""

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
plugin = pytest.importorskip("cpkv.integrations.sglang_platform")

from cpkv import ConfigError  # noqa: E402

pytestmark = pytest.mark.sglang

# the in-tree platform cpkv's extends: SGLang's CPU platform under a CPU build of torch (as in CI)
PLATFORM, BASE = (
    ("OwnerLaneCudaPlatform", "cuda.CudaSRTPlatform")
    if torch.cuda.is_available()
    else ("OwnerLaneCpuPlatform", "cpu.CpuSRTPlatform")
)

PROBE = """
    import json, torch
    from cpkv.integrations.cpu_stubs import install_torchvision_stub
    install_torchvision_stub()
    import sglang.srt.mem_cache.allocator.swa as swa
    import sglang.srt.mem_cache.kv_cache_configurator as kvc  # where SGLang builds its paged allocator
    from cpkv.integrations.sglang import OwnerLaneTokenToKVPoolAllocator
    platform = kvc.current_platform
    cls = platform.get_paged_allocator_cls()
    got = {
        "platform": f"{type(platform).__module__}.{type(platform).__qualname__}",
        "bases": [f"{b.__module__}.{b.__qualname__}" for b in type(platform).__mro__],
        "same_everywhere": swa.current_platform is platform,
        "allocator": None if cls is None else [c.__qualname__ for c in cls.__mro__],
    }
    if cls is not None:
        alloc = cls(64, 4, torch.bfloat16, "cpu", None, False)  # SGLang's six arguments
        out = alloc.alloc_extend(*[torch.tensor([0])] * 2, *[torch.tensor([40])] * 2, torch.tensor([-1]), 40)
        got |= {"same_class": platform.get_paged_allocator_cls() is cls,
                "group": [alloc.cp_size, alloc.config.owner_policy],
                "page_lanes": [int(s) // 4 % alloc.cp_size for s in out[::4].tolist()],
                "page_owners": alloc.last_plan.page_owners.tolist()}
    print(json.dumps(got))
"""


def start_sglang(**env: str) -> subprocess.CompletedProcess:
    """A fresh interpreter that imports SGLang's allocator configurator under ``env`` (no other SGLANG_ or
    CPKV_ variable) and prints what PROBE finds as JSON."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CPKV_"))} | env
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE)],
        capture_output=True,
        text=True,
        timeout=240,
        env=environ,
    )


def test_cpkv_is_registered_under_sglangs_platform_entry_point_group():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="sglang.srt.platforms")}
    assert eps.get("cpkv") == "cpkv.integrations.sglang_platform:activate"


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
def test_sglang_platform_cpkv_gives_sglang_the_owner_lane_allocator_class():
    """``SGLANG_PLATFORM=cpkv CPKV_CP_SIZE=4 CPKV_OWNER_POLICY=rotation``: the platform SGLang's allocator
    code holds is cpkv's (over SGLang's CPU platform without CUDA), its ``get_paged_allocator_cls()`` is
    ``OwnerLaneTokenToKVPoolAllocator`` bound to C = 4 and rotation, the same class at every call, and the
    pages it hands out are on the lanes of the ranks that compute them."""
    done = start_sglang(SGLANG_PLATFORM="cpkv", CPKV_CP_SIZE="4", CPKV_OWNER_POLICY="rotation")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["platform"] == f"cpkv.integrations.sglang_platform.{PLATFORM}"
    assert f"sglang.srt.platforms.{BASE}" in got["bases"]
    assert got["same_everywhere"] and got["same_class"]
    assert got["allocator"][:2] == ["OwnerLaneTokenToKVPoolAllocatorCP4", "OwnerLaneTokenToKVPoolAllocator"]
    assert got["group"] == [4, "rotation"]
    assert (
        got["page_owners"] == got["page_lanes"] == [0, 0, 1, 1, 2, 3, 3, 2, 1, 0]
    )  # 40 tokens: 10 pages of 4


def test_without_sglang_platform_cpkv_sglang_keeps_its_own_allocator():
    """Installed but not selected, the plugin declines: SGLang's own platform, its own allocator."""
    done = start_sglang(CPKV_CP_SIZE="4")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert not got["platform"].startswith("cpkv.") and got["allocator"] is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "CPKV_CP_SIZE is not set"),
        ({"CPKV_CP_SIZE": "four"}, "CPKV_CP_SIZE='four' is not a CP group size: not an integer"),
        ({"CPKV_CP_SIZE": "0"}, "CPKV_CP_SIZE='0' is not a CP group size: cp_size must be >= 1"),
        (
            {"CPKV_CP_SIZE": "2", "CPKV_OWNER_POLICY": "zigzag"},
            "CPKV_OWNER_POLICY='zigzag' is not an owner policy",
        ),
    ],
)
def test_a_bad_group_in_the_environment_is_a_config_error_naming_it(monkeypatch, env, message):
    monkeypatch.delenv("CPKV_CP_SIZE", raising=False)
    monkeypatch.delenv("CPKV_OWNER_POLICY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        plugin.group_from_env()


def test_sglang_start_fails_fast_on_a_bad_group():
    """Selected with no ``CPKV_CP_SIZE``: SGLang's platform resolution raises cpkv's ConfigError."""
    done = start_sglang(SGLANG_PLATFORM="cpkv")
    assert done.returncode != 0 and "ConfigError: environment variable CPKV_CP_SIZE is not set" in done.stderr


def test_activate_names_the_platform_only_when_selected(monkeypatch):
    monkeypatch.setenv("SGLANG_PLATFORM", "other")
    assert plugin.activate() is None
    monkeypatch.setenv("SGLANG_PLATFORM", "cpkv")
    assert plugin.activate() == f"cpkv.integrations.sglang_platform.{PLATFORM}"
