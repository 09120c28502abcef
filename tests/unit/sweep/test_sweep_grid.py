"""The grid file of ``cpkv sweep``: its keys are ``cpkv simulate``'s settings, taken from the
table the command is built from (``sim.settings.SETTINGS``); every value is converted as the flag would be; a bad grid is one ``cpkv: error:`` line
naming the file and key, exit 2, with nothing written."""

import itertools

import pytest

from cpkv.cli import main
from cpkv.cli.simulate import REPORT_OPTIONS, simulate
from cpkv.sim import settings
from cpkv.sim.config import KV_STORAGE_DESIGNS, SimConfig
from cpkv.sim.settings import (
    COST_OPTIONS,
    POLICY_OPTION,
    SELECTOR,
    STORAGE_OPTION,
    STRATEGY_OPTION,
    WORKLOAD_OPTIONS,
    Setting,
)
from cpkv.sweep.grid import SWEEP_KEYS, GridError, grid_keys, read_grid

pytestmark = pytest.mark.unit

BASE = """
[workload]
workload = "synthetic"
max_requests = 4
"""


def _grid(tmp_path, body: str, head: str = "", base: str = BASE):
    path = tmp_path / "grid.toml"
    path.write_text(head + base + body)
    return path


def test_grid_keys_are_simulates_settings_and_the_sweeps_own():
    flags = {p.opts[0][2:].replace("-", "_") for p in simulate.params if p.name not in REPORT_OPTIONS}
    assert sorted(grid_keys()) == sorted((flags - set(WORKLOAD_OPTIONS)) | set(SWEEP_KEYS))
    assert "policy" in grid_keys() and "policies" not in grid_keys()  # named by the flag, --policy


def test_every_simulate_option_reaches_the_replay():
    # config_of passes every option named like a SimConfig field; the others must be consumed by name, so
    # an option added to cpkv simulate as a SimConfig field needs no sweep code at all (--policy and
    # --kv-storage select replays, consumed by name; --cp-strategy selects replays and its first is the
    # SimConfig's cp_strategy).
    fields = {f.name for f in SimConfig.__dataclass_fields__.values()}
    consumed = (
        set(REPORT_OPTIONS)
        | set(WORKLOAD_OPTIONS)
        | set(COST_OPTIONS)
        | {POLICY_OPTION, STORAGE_OPTION, STRATEGY_OPTION}
    )
    assert [p.name for p in simulate.params if p.name not in fields | consumed] == []


def test_an_option_added_to_simulate_is_a_grid_key(tmp_path, monkeypatch):
    # The one table: a new cpkv simulate setting (here a stand-in for --kv-storage) is a grid key, with its
    # choices checked, without any list in the sweep to edit.
    setting = Setting(
        "kv_storage", "--kv-storage", str, ("owner-lane",), "", SELECTOR, choices=("owner-lane", "replicated")
    )
    monkeypatch.setattr(
        settings, "SETTINGS", (*(s for s in settings.SETTINGS if s.key != "kv_storage"), setting)
    )
    grid = read_grid(
        _grid(tmp_path, '[grid]\nkv_storage = ["owner-lane", "replicated"]\npolicy = "balanced"\n')
    )
    assert grid.axes["kv_storage"] == ("owner-lane", "replicated")
    with pytest.raises(
        GridError, match=r"\[grid\] kv_storage: 'interleaved' is not one of 'owner-lane', 'replicated'"
    ):
        read_grid(_grid(tmp_path, '[grid]\nkv_storage = ["interleaved"]\n'))


@pytest.mark.clause("C-STORAGE")
def test_kv_storage_values_are_design_names(tmp_path):
    """The real ``--kv-storage`` is repeatable: a grid value is one design (not a one-name tuple), ``all`` is
    every design, and an unknown name is refused with the choices."""
    grid = read_grid(
        _grid(tmp_path, '[grid]\nkv_storage = ["owner-lane", "replicated"]\npolicy = "balanced"\n')
    )
    assert grid.axes["kv_storage"] == ("owner-lane", "replicated")
    assert {p["kv_storage"][0] for p in grid.points()} == {"owner-lane", "replicated"}
    grid = read_grid(_grid(tmp_path, '[grid]\nkv_storage = "all"\npolicy = "balanced"\n'))
    assert grid.axes["kv_storage"] == KV_STORAGE_DESIGNS
    with pytest.raises(GridError, match=r"kv_storage: 'striped' is not one of 'owner-lane'"):
        read_grid(_grid(tmp_path, '[grid]\nkv_storage = "striped"\n'))


def test_values_convert_as_the_flags_do(tmp_path):
    grid = read_grid(
        _grid(
            tmp_path,
            """
[grid]
cp_size = [2, 4]
pages_per_lane = [512, "9,10,10,10"]
logits_budget_mb = 1
colocated_decode = [false, true]
policy = ["all"]
groups = [1, 3]
routing = "prefix"
cost_model = "illustrative"
""",
        )
    )
    assert grid.axes["pages_per_lane"] == (512, (9, 10, 10, 10))
    assert grid.given["pages_per_lane"] == (512, "9,10,10,10")
    assert grid.axes["logits_budget_mb"] == (1.0,)
    assert grid.axes["policy"] == ("rotation", "legacy", "balanced")  # all: every policy
    assert grid.varied == ["cp_size", "pages_per_lane", "colocated_decode", "policy", "groups"]
    points = grid.points()
    assert len(points) == 2 * 2 * 2 * 3 * 2
    assert [tuple(v for v, _ in p.values()) for p in points[:2]] == [
        (2, 512, 1.0, False, "rotation", 1, "prefix", "illustrative"),
        (2, 512, 1.0, False, "rotation", 3, "prefix", "illustrative"),
    ]  # the last key varies fastest


def test_exclude_rules_drop_exactly_the_matching_points(tmp_path):
    grid = read_grid(
        _grid(
            tmp_path,
            """
[grid]
cp_size = [2, 4, 8]
policy = ["rotation", "balanced"]
groups = [1, 2]

[[exclude]]
cp_size = [2, 4]
groups = 2

[[exclude]]
policy = "rotation"
cp_size = 8
""",
        )
    )
    got = {(p["cp_size"][0], p["policy"][0], p["groups"][0]) for p in grid.points()}
    want = {
        (c, pol, g)
        for c, pol, g in itertools.product([2, 4, 8], ["rotation", "balanced"], [1, 2])
        if not (c in (2, 4) and g == 2) and not (pol == "rotation" and c == 8)
    }
    assert got == want and len(got) == 12 - 4 - 2


def test_a_grid_without_policy_sweeps_every_policy(tmp_path):
    grid = read_grid(_grid(tmp_path, "[grid]\ncp_size = [2]\n"))
    assert [p["policy"][0] for p in grid.points()] == ["rotation", "legacy", "balanced"]


def test_target_conditions(tmp_path):
    grid = read_grid(
        _grid(tmp_path, "[grid]\ncp_size = 2\n", head='target = ["ttft_ms_p99 <= 2_000", "gpus < 16"]\n')
    )
    assert grid.target.text == "ttft_ms_p99 <= 2000 and gpus < 16"
    assert grid.target.holds({"ttft_ms_p99": 2000.0, "gpus": 8})
    assert not grid.target.holds({"ttft_ms_p99": 2000.5, "gpus": 8})
    assert not grid.target.holds({"ttft_ms_p99": 10.0, "gpus": 16})
    assert not grid.target.holds({"ttft_ms_p99": None, "gpus": 8})  # no finished request meets no bound
    slo = read_grid(_grid(tmp_path, "[grid]\nttft_slo_ms = 500\n", head='target = "slo_attainment >= 0.9"\n'))
    assert slo.target.text == "slo_attainment >= 0.9" and slo.axes["ttft_slo_ms"] == (500.0,)


BAD = [
    ("[grid\n", "", "not a valid TOML file"),
    ("", "", "[grid] is missing or empty"),
    ("[grid]\ncp_size = []\n", "", "[grid] cp_size is an empty list"),
    ("[grid]\ncp_sizes = [2]\n", "", "unknown setting 'cp_sizes'; the grid takes cp_size, page_size"),
    ("[grid]\ncp_size = [2, 'x']\n", "", "[grid] cp_size: 'x' is not a valid integer for --cp-size"),
    ("[grid]\ncp_size = [2.5]\n", "", "[grid] cp_size: 2.5 is not a valid integer for --cp-size"),
    ("[grid]\ncp_size = [true]\n", "", "[grid] cp_size: True is not a valid integer for --cp-size"),
    ("[grid]\ncp_size = [2, 2]\n", "", "[grid] cp_size lists 2 twice"),
    (
        "[grid]\npolicy = ['fastest']\n",
        "",
        "[grid] policy: 'fastest' is not one of 'rotation', 'legacy', 'balanced', 'all'",
    ),
    (
        "[grid]\npages_per_lane = ['9,x']\n",
        "",
        "[grid] pages_per_lane: '9,x' is not an int or a comma-separated list",
    ),
    ("[grid]\ngroups = [0]\n", "", "[grid] groups: groups must be an integer >= 1, got 0"),
    ("[grid]\nrouting = 'random'\n", "", "routing must be one of round-robin, prefix, got 'random'"),
    ("[grid]\nmax_requests = [4]\n", "", "unknown setting 'max_requests'; name the workload in [workload]"),
    ("[grid]\ncp_size = 2\n[[exclude]]\n", "", "[[exclude]] #1 is empty"),
    ("[grid]\ncp_size = 2\n[[exclude]]\ncp_size = 2\n", "", "the [[exclude]] rules exclude every point"),
    ("[grid]\ncp_size = 2\n[[exclude]]\nnope = 2\n", "", "[[exclude]] #1 nope: unknown setting 'nope'"),
    ("[grid]\ncp_size = 2\n", 'target = "ttft_ms_p99 below 2"\n', "is not 'metric op number'"),
    (
        "[grid]\ncp_size = 2\n",
        'target = "lane_pages_peak <= 2"\n',
        "'lane_pages_peak' is not a numeric metric",
    ),
    ("[grid]\ncp_size = 2\n", 'targets = "gpus <= 2"\n', "unknown top-level key 'targets'"),
    (
        "[grid]\ncp_size = 2\n",
        'target = "slo_attainment >= 0.9"\n',
        "target 'slo_attainment >= 0.9' needs ttft_slo_ms in [grid] (ms, as --ttft-slo-ms)",
    ),
]


@pytest.mark.parametrize(("body", "head", "message"), BAD)
def test_a_bad_grid_is_one_error_line_exit_2_and_writes_nothing(tmp_path, capsys, body, head, message):
    path = _grid(tmp_path, body, head)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"cpkv: error: {path}:") and message in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ('[workload]\ntrace = "t.jsonl"\nworkload = "synthetic"\n', "give trace or workload, not both"),
        ("[workload]\nmax_requests = 0\n", "[workload] max_requests: must be an integer >= 1, got 0"),
        ('[workload]\nworkload = "huge"\n', "[workload] workload: 'huge' is not one of 'synthetic'"),
        (
            "[workload]\nseed = 3\n",
            "[workload] takes trace, workload, max_requests, start, duration, rate_scale, not 'seed'",
        ),
        ('[workload]\ntrace = "missing.jsonl"\n', "missing.jsonl"),
    ],
)
def test_a_bad_workload_is_one_error_line(tmp_path, capsys, workload, message):
    path = _grid(tmp_path, "[grid]\ncp_size = 2\ncost_model = 'illustrative'\n", base=workload)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_trace_path_is_relative_to_the_grid_file(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "g.toml"
    path.write_text('[workload]\ntrace = "../t.jsonl"\n[grid]\ncp_size = 2\n')
    assert read_grid(path).workload["trace"] == tmp_path / "sub" / ".." / "t.jsonl"


def test_usage_errors(tmp_path, capsys):
    path = _grid(tmp_path, "[grid]\ncp_size = 2\n")
    assert main(["sweep", str(path), "--ray-address", "auto"]) == 2
    assert "--ray-address needs --executor ray" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "none.toml")]) == 2
    assert "cannot read grid" in capsys.readouterr().err
    assert main(["sweep", str(path), "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
