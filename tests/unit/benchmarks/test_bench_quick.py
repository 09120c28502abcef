"""The benchmark scripts (benchmarks/) run with --quick, print their table and write their JSON.

Figures are not checked here: speed is tracked by the full runs in benchmarks/README.md.
"""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from extras import COST

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"

SCRIPTS = [
    ("bench_plan_alloc.py", [], "plan+alloc ms"),
    ("bench_plan_alloc.py", ["--cp-strategy", "compare"], "interleave plan+alloc ms"),
    ("bench_layout.py", [], "fresh copy ms"),
    ("bench_memory.py", [], "allocator B/page"),
    pytest.param(
        "bench_simulate.py",
        ["--max-requests", "100", "--cost-model", "illustrative"],
        "peak RSS MiB",
        marks=pytest.mark.skipif(not TRACE.exists(), reason=f"needs the shared trace {TRACE}"),
    ),
    pytest.param(
        "bench_simulate.py",
        ["--max-requests", "100", "--cost-model", "illustrative", "--accounting", "1"],
        "peak RSS MiB",
        marks=pytest.mark.skipif(not TRACE.exists(), reason=f"needs the shared trace {TRACE}"),
    ),
    pytest.param(
        "bench_costs.py",
        [],
        "aiconfigurator ms",
        marks=pytest.mark.skipif(not (COST.installed or COST.required), reason="needs the cost extra"),
    ),
    pytest.param(
        "bench_validation.py",
        [],
        "measured us",
        marks=pytest.mark.skipif(not (COST.installed or COST.required), reason="needs the cost extra"),
    ),
    ("bench_sweep.py", [], "speed-up vs 1"),
    pytest.param(
        "bench_interleave_pricing.py",
        [],
        "TTFT p99 s",
        marks=[
            pytest.mark.skipif(not TRACE.exists(), reason=f"needs the shared trace {TRACE}"),
            pytest.mark.skipif(not (COST.installed or COST.required), reason="needs the cost extra"),
        ],
    ),
    pytest.param(
        "bench_prefix_cache.py",
        [],
        "hit tokens",
        marks=pytest.mark.skipif(not TRACE.exists(), reason=f"needs the shared trace {TRACE}"),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "extra", "column"), SCRIPTS)
def test_quick_run_prints_table_and_json(script, extra, column, tmp_path):
    figures = tmp_path / "figures.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--json", str(figures), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = next((line for line in proc.stdout.splitlines() if column in line), None)
    assert header is not None, f"no table header with {column!r} in:\n{proc.stdout}"
    rule = proc.stdout.splitlines()[proc.stdout.splitlines().index(header) + 1]
    assert set(rule) <= {"-", " "} and "-" in rule  # the header is followed by the table's rule
    payload = json.loads(figures.read_text())
    assert payload["quick"] is True
    assert payload["machine"]["nproc"] >= 1


@pytest.mark.slow
def test_vs_sglang_exits_0_with_a_message_where_sglang_is_missing():
    # bench_vs_sglang.py needs SGLang (its own environment, see benchmarks/README.md); in the test
    # environment, which has none, it must say so and exit 0, so CI can call it unconditionally.
    # The installed distribution, not find_spec: pytest puts tests/integration on sys.path for its own
    # tests, where the folder tests/integration/sglang would pass for the package.
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip("sglang is installed here: the quick run is CI's (.ci/run) job")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_vs_sglang.py"), "--quick"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == (
        "bench_vs_sglang: skipped: sglang is not importable in this environment "
        "(see benchmarks/README.md: bench_vs_sglang.py)"
    )
