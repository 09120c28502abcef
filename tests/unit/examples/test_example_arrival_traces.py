"""``examples/arrival_traces.py`` writes the README's arrival-pattern traces, each loadable by
``cpkv simulate --trace``: the request counts, lengths and arrival times the README states, no shared
prefix (one hash block per request)."""

import subprocess
import sys
from pathlib import Path

import pytest

from cpkv.sim.trace import load_trace

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-BALANCED")]

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "arrival_traces.py"


def test_arrival_traces_are_the_readme_patterns(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    reqs = {
        name: load_trace(tmp_path / f"{name}.jsonl")
        for name in ("burst512_65", "burst24_65", "one_at_a_time_65_127", "burst64_64")
    }
    for name, n, length in (("burst512_65", 512, 65), ("burst24_65", 24, 65), ("burst64_64", 64, 64)):
        assert len(reqs[name]) == n
        assert {(r.arrival_ms, r.input_length) for r in reqs[name]} == {(0.0, length)}
    one = reqs["one_at_a_time_65_127"]
    assert [r.arrival_ms for r in one] == [25.0 * i for i in range(200)]
    assert all(65 <= r.input_length <= 127 for r in one) and len({r.input_length for r in one}) > 30
    for rs in reqs.values():
        assert len({r.hash_ids for r in rs}) == len(rs) and all(r.output_length == 0 for r in rs)
