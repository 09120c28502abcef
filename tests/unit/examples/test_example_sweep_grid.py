"""``examples/sweep_mooncake.toml`` (the sweep's acceptance grid) is a valid grid of at least 24 points over
cp_size x pages per lane x policy x storage on the first 2,000 trace requests (48 points; the replicated
design runs once whatever the policy, so 36 replays)."""

from pathlib import Path

import pytest

from cpkv.sweep.grid import grid_keys, read_grid

pytestmark = pytest.mark.unit

GRID = Path(__file__).resolve().parents[3] / "examples" / "sweep_mooncake.toml"


def test_the_example_grid_sweeps_cp_size_pool_policy_and_storage(tmp_path):
    text = GRID.read_text()
    path = tmp_path / "examples" / GRID.name  # the trace path is relative to the grid file
    path.parent.mkdir()
    path.write_text(text)
    grid = read_grid(path)
    assert grid.workload["max_requests"] == 2000
    assert (
        grid.workload["trace"].resolve()
        == (tmp_path / ".." / "shared" / "traces" / "mooncake_conversation_trace.jsonl").resolve()
    )
    assert "kv_storage" in grid_keys()
    assert grid.varied == ["cp_size", "pages_per_lane", "policy", "kv_storage", "groups"]
    points = grid.points()
    assert len(points) == 48
    assert {(p["cp_size"][0], p["groups"][0]) for p in points} == {
        (4, 4),
        (4, 8),
        (4, 16),
        (8, 2),
        (8, 4),
        (8, 8),
    }
    assert grid.target.text == "ttft_ms_p99 <= 10000"
