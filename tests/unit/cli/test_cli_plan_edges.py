"""`cpkv plan` edges: ignored head owner warns, no request, strip documentation, shared defaults."""

import json

import pytest

from cpkv.cli import app, main
from cpkv.cli.plan_view import lane_strip
from cpkv.sim.config import SimConfig

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--prefix-len", "0", "--extend-len", "100", "--head-owner", "1"], "prefix_len=0 fills whole pages"),
        (["--prefix-len", "100", "--extend-len", "0", "--head-owner", "1"], "extend_len=0 computes no token"),
    ],
)
def test_ignored_head_owner_warns_on_stderr(argv, reason, capsys):
    assert main(["plan", *argv, "--policy", "rotation", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["requests"][0]["head_owner"] is None  # the plan itself is unchanged
    assert out.err == f"cpkv: warning: request 0: --head-owner 1 is ignored: {reason} (no head tokens)\n"


def test_used_or_absent_head_owner_does_not_warn(capsys):
    assert (
        main(
            [
                "plan",
                "--prefix-len",
                "100",
                "--extend-len",
                "5",
                "--head-owner",
                "1",
                "--prefix-len",
                "0",
                "--extend-len",
                "5",
                "--head-owner",
                "-1",
                "--policy",
                "rotation",
                "--json",
            ]
        )
        == 0
    )
    assert capsys.readouterr().err == ""


def test_balanced_plan_says_the_allocator_chooses_its_phases(capsys):
    # The planner has no free pages: under balanced (the default) it shows the rotation rule's phases, and
    # says so, since the allocator's plan_extend chooses them from the lanes' free pages (C-BALANCED).
    assert main(["plan", "--prefix-len", "0", "--extend-len", "64", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["requests"][0]["phase"] == 0
    assert out.err == (
        "cpkv: note: under balanced the allocator chooses each phase from the lanes' free pages "
        "(C-BALANCED); the planner alone, shown here, uses the rotation rule\n"
    )


def test_plan_without_request_says_give_at_least_one(capsys):
    assert main(["plan"]) == 2
    err = capsys.readouterr().err
    assert err == "cpkv: error: give at least one request (--prefix-len N --extend-len M, or --batch FILE)\n"


def test_plan_help_documents_the_run_length_strip(capsys):
    assert main(["plan", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "run-length" in text and "0x13 1x13" in text and "13 pages on lane 0" in text


def test_run_length_strip_as_documented(capsys):
    # 200 pages at C=8 (above 96 pages): zigzag segments of 13 pages (lanes 0..7) then 12 (lanes 7..0);
    # the two segments of lane 7 touch, so they form one run of 25.
    argv = ["plan", "--prefix-len", "0", "--extend-len", str(200 * 64), "--policy", "rotation"]
    assert main([*argv, "--json"]) == 0
    owners = json.loads(capsys.readouterr().out)["requests"][0]["page_owners"]
    expected = [lane for lane in range(8) for _ in range(13)] + [
        lane for lane in range(7, -1, -1) for _ in range(12)
    ]
    assert owners == expected
    strip = lane_strip(owners, 8)
    assert strip == "0x13 1x13 2x13 3x13 4x13 5x13 6x13 7x25 6x12 5x12 4x12 3x12 2x12 1x12 0x12"
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert all(run in table for run in strip.split())  # the table shows that strip (folded over lines)


def _defaults(command: str) -> dict:
    return {p.name: p.default for p in app.commands[command].params}


def test_plan_and_simulate_share_cp_size_and_page_size_defaults():
    plan, sim = _defaults("plan"), _defaults("simulate")
    assert (plan["cp_size"], plan["page_size"]) == (sim["cp_size"], sim["page_size"])
    assert (sim["cp_size"], sim["page_size"]) == (SimConfig().cp_size, SimConfig().page_size) == (8, 64)


def test_run_dist_page_size_default_is_the_same():
    # run-dist loads with its command (cpkv.cli._LazyGroup); its --page-size default is plan's and simulate's.
    import click

    ctx = click.Context(app)
    run_dist = app.get_command(ctx, "run-dist")
    page_size = {p.name: p.default for p in run_dist.params}["page_size"]
    assert page_size == _defaults("simulate")["page_size"] == 64
