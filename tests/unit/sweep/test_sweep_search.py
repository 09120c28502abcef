"""``groups = "search"``: the fewest groups that meet the target for each combination of
the other keys, by bisection with the neighbours checked, in fewer replays than listing every group count;
"not met within the bounds" said; and the grid's ``pages_per_lane = "auto"``."""

import json
from pathlib import Path

import pytest

from cpkv.cli import main
from cpkv.sweep.grid import SEARCH_BOUNDS, GridError, read_grid
from cpkv.sweep.results import designs
from cpkv.sweep.run import sweep

pytestmark = pytest.mark.unit

GRID = """target = "ttft_ms_p99 <= 3350"

[workload]
workload = "synthetic"
max_requests = 48

[grid]
cp_size = [2, 4]
page_size = 16
pages_per_lane = 6000
policy = "rotation"
kv_storage = ["owner-lane", "replicated"]
cost_model = "illustrative"
GROUPS
"""  # two designs x two CP sizes


def _grid(tmp_path: Path, groups: str, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(GRID.replace("GROUPS", groups))
    return path


def _fewest(outcome, grid) -> dict:
    table = designs(outcome.rows, grid.varied, grid.target)
    return {(d["cp_size"], d["kv_storage"]): (d["row"]["groups"] if d["fits"] else None) for d in table}


def test_search_finds_the_listed_grids_fewest_groups_in_fewer_replays(tmp_path):
    listed = read_grid(_grid(tmp_path, "groups = [1, 2, 3, 4, 5, 6, 7, 8]", "listed"))
    searched = read_grid(_grid(tmp_path, "groups = {search = [1, 8]}", "searched"))
    assert searched.search == (1, 8) and searched.varied[-1] == "groups"
    every = sweep(listed, tmp_path / "a", workers=1, progress=False, table=False)
    found = sweep(searched, tmp_path / "b", workers=1, progress=False, table=False)
    want = _fewest(every, listed)
    assert set(want.values()) - {None} and want == _fewest(found, searched)  # the same answer per design
    assert every.replayed == 32 and found.replayed < every.replayed  # fewer replays
    # every searched point is the listed grid's point, metric for metric
    by = {(r["cp_size"], r["kv_storage"], r["groups"]): r for r in every.rows}
    for r in found.rows:
        assert r["ttft_ms_p99"] == by[r["cp_size"], r["kv_storage"], r["groups"]]["ttft_ms_p99"]
    record = json.loads((tmp_path / "b" / "results.json").read_text())["search"]
    for f in record:
        key = (int(f["design"]["cp_size"]), f["design"]["kv_storage"])
        assert f["fewest_groups"] == want[key] and f["monotone"]
        g = f["fewest_groups"]
        assert {g - 1, g} <= set(f["tried"]) or g == 1  # the neighbour below was replayed (it fails)


def test_not_met_within_the_bounds_is_said(tmp_path, capsys):
    grid = _grid(tmp_path, "groups = {search = [1, 3]}", "tight")
    assert main(["sweep", str(grid), "--out", str(tmp_path / "o"), "--no-progress", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "search: cp_size=2, page_size=16, pages_per_lane=6000, policy=rotation, kv_storage=owner-lane" in out
    )
    assert "the target is not met within groups 1..3 (tried [3])" in out
    assert "error band of the times above: illustrative constants: no error band" in out
    record = json.loads((tmp_path / "o" / "results.json").read_text())["search"]
    assert [f["fewest_groups"] for f in record if f["design"]["cp_size"] == 4] == [2, 2]


def test_search_grid_errors(tmp_path):
    assert read_grid(_grid(tmp_path, 'groups = "search"', "d")).search == SEARCH_BOUNDS
    bad = tmp_path / "bad.toml"
    for groups, message in (
        ("groups = {search = [3, 1]}", "1 <= lo <= hi"),
        ("groups = {search = 4}", "1 <= lo"),
    ):
        bad.write_text(GRID.replace("GROUPS", groups))
        with pytest.raises(GridError, match=message):
            read_grid(bad)
    bad.write_text(GRID.replace("GROUPS", 'groups = "search"').replace('target = "ttft_ms_p99 <= 3350"', ""))
    with pytest.raises(GridError, match="needs a target"):
        read_grid(bad)


def test_pages_per_lane_auto_is_the_default(tmp_path):
    from cpkv.sweep.points import prepare_points

    path = tmp_path / "auto.toml"
    path.write_text(
        GRID.replace("GROUPS", "").replace("pages_per_lane = 6000", 'pages_per_lane = ["auto", 500]')
    )
    plan = prepare_points(read_grid(path))
    assert sorted({r["pages_per_lane"] for r in plan.rows}) == [500, 16384]  # illustrative: the default pool
