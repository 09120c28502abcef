"""cpkv's general SGLang plugin (``sglang.srt.plugins``): scheduler hooks, version pin, bad configuration.

The entry point matters only in a fresh interpreter (SGLang loads its plugins once, at start-up), so the
entry-point cases start one, as a server process would, and call SGLang's own ``load_plugins()``. The
scheduler components are SGLang's own classes and methods on CPU: ``Scheduler.init_running_status``,
``init_pool_stats_observer`` and ``init_invariant_checker`` on a stand-in scheduler holding cpkv's allocator
and SGLang's ``RadixCache``, the checker's leak check with and without the hooks, and ``PrefillAdder``.
In this process the hooks are applied once (``register``) and pass through whenever ``SGLANG_PLATFORM``
is not ``cpkv``: the "without" cases unset it.
"""

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import types
from array import array
from pathlib import Path

import pytest
import torch
from sglang_topology import cp_topology

sgl = pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
hooks = pytest.importorskip("cpkv.integrations.sglang_hooks")
checks = pytest.importorskip("cpkv.integrations.sglang_checks")
scheduler_mod = pytest.importorskip("sglang.srt.managers.scheduler")

import sglang.srt.mem_cache.radix_cache as radix  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.managers.schedule_policy import PrefillAdder  # noqa: E402
from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker  # noqa: E402
from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_extend  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.page_interleave import page_interleave_shard_size  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from cpkv import ConfigError  # noqa: E402
from cpkv.integrations import sglang_cp_split, sglang_hicache  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

pytestmark = pytest.mark.sglang

Scheduler = scheduler_mod.Scheduler
P, RANK_TOKENS, CHAIN_PAGES = 4, 16, 5  # one rank: 16 tokens = 4 pages (+ its padding page)
EXPECTED_TARGETS = sorted({target for target, _, _ in hooks.hooks()})  # this module's and sglang_hicache's

# ------------------------------------------------------------------------------------ fresh interpreter
PROBE = """
    import json, sys
    from cpkv.integrations.cpu_stubs import install_torchvision_stub
    install_torchvision_stub()
    {before}
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    load_plugins()  # what SGLang's engine and every scheduler process run first
    from cpkv.integrations import sglang_hooks as h
    import pkgutil
    print(json.dumps({{
        "hooked": sorted(HookRegistry._hooks),
        "applied": sorted({{t for t, f, _ in h.hooks() if h.hook_applied(t, f)}}),
        "wrapped": sorted({{t for t, _, _ in h.hooks() if hasattr(pkgutil.resolve_name(t), "__wrapped__")}}),
        "plugin_module_loaded": "cpkv.integrations.sglang_hooks" in sys.modules,
    }}))
"""


def start(before: str = "", **env: str) -> subprocess.CompletedProcess:
    """A fresh interpreter under ``env`` only (no other SGLANG_ / CPKV_ variable) that runs SGLang's
    ``load_plugins()`` after ``before`` and prints what it finds as JSON."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CPKV_"))} | env
    code = textwrap.dedent(PROBE.format(before=before))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=environ
    )


def last_json(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pyproject_registers_the_general_plugin_entry_point():
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["sglang.srt.plugins"] == {
        "cpkv": "cpkv.integrations.sglang_hooks:register"
    }
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    assert installed.get("cpkv") == "cpkv.integrations.sglang_hooks:register"


def test_sglang_platform_unset_changes_nothing_in_a_fresh_interpreter():
    """Installed, ``CPKV_CP_SIZE`` set, ``SGLANG_PLATFORM`` unset: SGLang loads the plugin, which registers
    no hook and wraps nothing."""
    got = last_json(start(CPKV_CP_SIZE="4"))
    assert got == {"hooked": [], "applied": [], "wrapped": [], "plugin_module_loaded": True}


def test_sglang_platform_cpkv_applies_every_hook_in_a_fresh_interpreter():
    got = last_json(start(SGLANG_PLATFORM="cpkv", CPKV_CP_SIZE="4"))
    assert got["hooked"] == got["applied"] == got["wrapped"] == EXPECTED_TARGETS
    assert sglang_cp_split.TARGET in EXPECTED_TARGETS  # the CP prefill's split from cpkv's plan
    # CommonKVManager.__init__ carries two
    assert len(EXPECTED_TARGETS) == 4 + len(sglang_cp_split.hooks()) + len(sglang_hicache.HOOK_TARGETS)


def test_a_hook_that_does_not_apply_stops_the_start_with_one_line_naming_it():
    """The checker's method renamed away (as another SGLang release might): the start stops, exit 1, the
    last line of stderr names the target."""
    target = hooks.TARGETS["check_full_pool"]
    before = (
        "from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker\n"
        "    del SchedulerInvariantChecker._check_full_pool"
    )
    done = start(before, SGLANG_PLATFORM="cpkv", CPKV_CP_SIZE="4")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        f"cpkv: SGLang 0.5.23 hook did not apply: {target} (see SGLang's 'Failed to apply hooks' log above); "
        "the start stops"
    )


def test_another_sglang_version_stops_the_start_with_one_line_naming_it():
    done = start(
        "import sglang.version; sglang.version.__version__ = '0.5.22'",
        SGLANG_PLATFORM="cpkv",
        CPKV_CP_SIZE="2",
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "cpkv: SGLang 0.5.22 is installed but cpkv's SGLang plugin is pinned to 0.5.23 (its hooks name that "
        "release's functions): install sglang==0.5.23 or unset SGLANG_PLATFORM"
    )


# ------------------------------------------------------------------------------ scheduler components
@pytest.fixture
def cpkv_selected(monkeypatch):
    """``SGLANG_PLATFORM=cpkv`` and the hooks applied in this process; yields a setter for CPKV_CP_SIZE."""
    monkeypatch.setenv("SGLANG_PLATFORM", "cpkv")
    hooks.register()
    assert all(hooks.hook_applied(t, f) for t, f, _ in hooks.hooks())

    def select(C):
        monkeypatch.setenv("CPKV_CP_SIZE", str(C))

    return select


def cached_chain(C):
    """cpkv's allocator (SGLang's six arguments, 16 tokens a rank) and SGLang's RadixCache over it, holding
    one evictable 5-page chain: lanes short unevenly, so the floor is below the aggregate free size."""
    alloc = sgl.OwnerLaneTokenToKVPoolAllocator(RANK_TOKENS, P, torch.float32, "cpu", None, False, cp_size=C)
    tree = radix.RadixCache.create_simulated(mock_allocator=alloc, page_size=P)
    zero, n = torch.tensor([0]), torch.tensor([CHAIN_PAGES * P])
    loc = alloc.alloc_extend(zero, zero, n, n, torch.tensor([-1]), CHAIN_PAGES * P)
    tree.insert(InsertParams(key=radix.RadixKey(array("q", range(CHAIN_PAGES * P))), value=loc))
    assert tree.evictable_size() == CHAIN_PAGES * P and alloc.available_size() < alloc.aggregate_free_size()
    return alloc, tree


def stand_in_scheduler(alloc, tree, *, is_hybrid_swa=False, enable_hisparse=False, page_size=P):
    """A ``Scheduler`` without its TP worker: the fields its init methods read, then SGLang's own
    ``init_running_status`` (hooked), ``init_pool_stats_observer`` and ``init_invariant_checker``."""
    s = object.__new__(Scheduler)
    s.token_to_kv_pool_allocator, s.tree_cache, s.page_size = alloc, tree, page_size
    s.is_hybrid_swa, s.enable_hisparse, s.is_hybrid_ssm = is_hybrid_swa, enable_hisparse, False
    s.max_total_num_tokens = RANK_TOKENS  # SGLang's per-rank pool, as its model runner sizes it
    s.req_to_token_pool = s.hisparse_coordinator = s.chunked_req = s.scheduler_stage_metrics = None
    s.full_tokens_per_layer = s.swa_tokens_per_layer = None
    s.disaggregation_mode = DisaggregationMode.NULL
    C = getattr(alloc, "cp_size", 1)
    with get_parallel().override(**cp_topology(C)):
        s.init_running_status()
    s.init_pool_stats_observer()
    s.init_invariant_checker()
    return s


def full_pool_check(s, checker_hook=True):
    ps = s.pool_stats_observer.get_pool_stats()
    check = SchedulerInvariantChecker._check_full_pool
    with get_parallel().override(dcp_enabled=False):
        return check(s.invariant_checker, ps) if checker_hook else check.__wrapped__(s.invariant_checker, ps)


@pytest.mark.clause("C-ALLOC")
@pytest.mark.parametrize("C", [2, 3, 4, 8])
def test_scheduler_sees_the_groups_capacity_and_the_checker_finds_no_leak(C, cpkv_selected, monkeypatch):
    cpkv_selected(C)
    alloc, tree = cached_chain(C)
    s = stand_in_scheduler(alloc, tree)
    assert s.kv_shard_widening == C and s.invariant_checker.max_total_num_tokens == C * RANK_TOKENS
    free = alloc.aggregate_free_size()
    assert full_pool_check(s) == (
        False,
        f"[full] total={C * RANK_TOKENS}, available={free}, evictable=20, "
        "protected=0, session_held=0, uncached=0",
    )
    # widened but the checker's free term left at the floor: the missing pages read as a leak
    leak, msg = full_pool_check(s, checker_hook=False)
    assert leak and f"available={alloc.available_size()}," in msg
    # without the hooks (SGLANG_PLATFORM unset): SGLang's own widening 1 and a leak
    monkeypatch.delenv("SGLANG_PLATFORM")
    bare = stand_in_scheduler(alloc, tree)
    assert bare.kv_shard_widening == 1
    leak, msg = full_pool_check(bare)
    assert leak and msg.startswith(
        f"[full] total={RANK_TOKENS}, available={alloc.available_size()}, evictable=20"
    )


@pytest.mark.parametrize("C", [2, 3, 4, 8])
def test_prefill_adder_reserves_a_page_a_lane_and_sglang_passes_no_rotation_bases(
    C, cpkv_selected, monkeypatch
):
    cpkv_selected(C)
    alloc, tree = cached_chain(C)

    def adder():
        return PrefillAdder(
            P,
            tree,
            alloc,
            running_batch=types.SimpleNamespace(reqs=[]),
            new_token_ratio=0.5,
            rem_input_tokens=64,
            rem_chunk_tokens=None,
        )

    a = adder()
    assert a.per_req_token_overhead == C * P
    assert (a.kv_shard_size, a.kv_shard_scratch_spec, page_interleave_shard_size(alloc)) == (1, None, 1)
    seen = []
    alloc_extend = alloc.alloc_extend
    monkeypatch.setattr(
        alloc, "alloc_extend", lambda *a, **kw: seen.append(sorted(kw)) or alloc_extend(*a, **kw)
    )
    i64 = lambda v: torch.tensor([v])  # noqa: E731
    out = alloc_paged_token_slots_extend(tree, i64(0), i64(0), i64(2 * P), i64(2 * P), i64(-1), 2 * P)
    assert out is not None and seen == [[]]  # SGLang's shard size 1: no rotation_bases keyword
    monkeypatch.delenv("SGLANG_PLATFORM")
    assert adder().per_req_token_overhead == P  # SGLang's own value without the hooks


# ------------------------------------------------------------------------------- bad configuration
def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    ("args", "cp_size", "message"),
    [
        (
            {"attn_cp_size": 2},
            4,
            "CPKV_CP_SIZE=4 but SGLang's attention CP size is attn_cp_size=2: set CPKV_CP_SIZE "
            "to the --attn-cp-size SGLang runs",
        ),
        (
            {"attn_cp_size": 4, "enable_kv_cache_sharding": True},
            4,
            "--enable-kv-cache-sharding (enable_kv_cache_sharding=True) is set with SGLANG_PLATFORM=cpkv",
        ),
        ({"attn_cp_size": 1, "enable_kv_cache_sharding": True}, 1, "--enable-kv-cache-sharding"),
        (
            {"attn_cp_size": 4, "enable_hisparse": True},
            4,
            "--enable-hisparse (enable_hisparse=True) at CPKV_CP_SIZE=4: "
            "cpkv's owner lanes serve full-attention paged pools only",
        ),
    ],
)
def test_bad_launch_flags_get_one_line_naming_the_value(monkeypatch, args, cp_size, message):
    """Through the cpkv platform's ``apply_server_args_defaults`` (SGLang calls it after parsing its
    ServerArgs); the flags are ServerArgs fields of 0.5.23."""
    plugin = pytest.importorskip("cpkv.integrations.sglang_platform")
    assert {"attn_cp_size", "enable_kv_cache_sharding", "enable_hisparse"} <= set(
        ServerArgs.__struct_fields__
    )
    monkeypatch.setenv("CPKV_CP_SIZE", str(cp_size))
    server_args = types.SimpleNamespace(
        **({"enable_kv_cache_sharding": False, "enable_hisparse": False} | args)
    )
    with pytest.raises(ConfigError) as exc:
        plugin.OwnerLaneCpuPlatform().apply_server_args_defaults(server_args)
    assert one_line(exc).startswith(message)
    plugin.OwnerLaneCpuPlatform().apply_server_args_defaults(
        types.SimpleNamespace(attn_cp_size=cp_size)
    )  # fine


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("swa", "a sliding-window (SWA) model (is_hybrid_swa=True) at CPKV_CP_SIZE=4"),
        ("hisparse", "--enable-hisparse (enable_hisparse=True) at CPKV_CP_SIZE=4"),
        (
            "page1",
            "SGLang's TokenToKVPoolAllocator (page_size=1) at CPKV_CP_SIZE=4: cpkv's owner lanes serve "
            "full-attention paged pools only (page_size=1 takes SGLang's token allocator: use --page-size > 1)",
        ),
        ("cp", "CPKV_CP_SIZE=4 but SGLang's attention CP size is attn_cp_size=2"),
    ],
)
def test_a_scheduler_cpkv_cannot_serve_stops_with_one_line(cpkv_selected, kind, message):
    """At C > 1 the scheduler's allocator must be cpkv's: SWA, HiSparse and page_size 1 get SGLang's own."""
    cpkv_selected(4)
    s = object.__new__(Scheduler)
    s.is_hybrid_swa, s.enable_hisparse, s.page_size = (
        kind == "swa",
        kind == "hisparse",
        1 if kind == "page1" else P,
    )
    if kind == "page1":
        s.token_to_kv_pool_allocator = TokenToKVPoolAllocator(64, torch.float32, "cpu", None, False)
    else:
        s.token_to_kv_pool_allocator = PagedTokenToKVPoolAllocator(64, P, torch.float32, "cpu", None, False)
    with get_parallel().override(**cp_topology(2 if kind == "cp" else 4)), pytest.raises(ConfigError) as exc:
        s.init_running_status()
    assert one_line(exc).startswith(message)


def test_the_version_pin_is_the_installed_sglang_and_refuses_others():
    assert checks.SGLANG_VERSION == importlib.metadata.version("sglang") == checks.check_sglang_version()
    with pytest.raises(ConfigError) as exc:
        checks.check_sglang_version("0.5.9")
    assert one_line(exc).startswith("SGLang 0.5.9 is installed but cpkv's SGLang plugin is pinned to 0.5.23")
