"""``cpkv simulate``'s settings as data (``sim/settings.py``, issue 34): the table builds the command's click
options (same flags, defaults, help), converts a value as the flag would (click's words in its errors), and
``validate.expand_all`` selects the replays (``all`` expanded, each name checked once, in order given)."""

import inspect
from pathlib import Path

import click
import pytest

from cpkv.cli.simulate import REPORT_OPTIONS, simulate
from cpkv.config import CP_STRATEGIES, DEFAULT_PAGE_SIZE, OWNER_POLICIES
from cpkv.cost.spec import DEFAULT_BACKEND, DEFAULT_GPU, DEFAULT_MODEL, MeasuredSpec
from cpkv.errors import ConfigError, InputError
from cpkv.sim import settings
from cpkv.sim.config import KV_STORAGE_DESIGNS, SimConfig
from cpkv.sim.settings import (
    CONFIG,
    COST,
    COST_OPTIONS,
    SELECTOR,
    SETTINGS,
    WORKLOAD,
    WORKLOAD_OPTIONS,
    by_key,
    config_of,
    defaults,
    measured_spec,
    workload_of,
)
from cpkv.sim.storage import build_storage
from cpkv.validate import check_name, expand_all, parse_pages_per_lane

pytestmark = pytest.mark.unit

OPTIONS = {p.name: p for p in simulate.params}


def test_every_setting_is_a_click_option_of_simulate_with_its_flag_default_and_help():
    assert [s.name for s in SETTINGS] + list(REPORT_OPTIONS) == list(OPTIONS)  # table order is --help's
    for s in SETTINGS:
        o = OPTIONS[s.name]
        assert (o.opts, o.multiple, o.help, o.is_flag) == ([s.flag], s.multiple, s.help, s.kind is bool), (
            s.name
        )
        assert (o.show_default or False) == s.show_default, s.name
        assert getattr(o.type, "choices", None) == s.choices, s.name
        if s.kind is not bool:
            assert o.default == s.default, s.name


def test_simulate_given_no_flag_parses_to_the_tables_defaults():
    ctx = simulate.make_context("simulate", [])
    parsed = {k: v for k, v in ctx.params.items() if k not in REPORT_OPTIONS}
    assert parsed == defaults()
    assert defaults()["policies"] == ("all",) and defaults()["page_size"] == DEFAULT_PAGE_SIZE == 64


def test_the_only_cli_only_options_are_the_reports():
    assert REPORT_OPTIONS == ("out_dir", "no_progress")
    assert sorted(set(OPTIONS) - {s.name for s in SETTINGS}) == ["no_progress", "out_dir"]


def test_groups_name_what_each_setting_feeds():
    fields = {f for f in SimConfig.__dataclass_fields__}
    assert all(s.name in fields for s in SETTINGS if s.group == CONFIG)
    assert all(s.name not in fields for s in SETTINGS if s.group != CONFIG)
    assert {s.group for s in SETTINGS} == {WORKLOAD, CONFIG, COST, SELECTOR}
    assert WORKLOAD_OPTIONS == ("trace", "workload", "max_requests", "start", "duration", "rate_scale")
    assert COST_OPTIONS == tuple(inspect.signature(measured_spec).parameters)  # passed positionally
    assert [s.name for s in SETTINGS if s.group == SELECTOR] == ["policies", "kv_storage", "cp_strategies"]
    assert [s.key for s in SETTINGS if s.group == SELECTOR] == ["policy", "kv_storage", "cp_strategy"]
    assert list(by_key())[:3] == ["trace", "workload", "cp_size"]


GOOD = {int: [0, 3], float: [0, 2, 2.5, True], str: ["x", 7], Path: ["t.jsonl"]}
BAD = {int: ["x", "2.5"], float: ["a", ""], str: [], Path: [""]}


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.kind is not bool], ids=lambda s: s.key)
def test_convert_takes_a_value_as_the_flag_does(s):
    # Setting.convert against click's own parse of the generated option: the same value, or the same words.
    option, ctx = OPTIONS[s.name], click.Context(simulate)
    values = list(s.choices) + ["nope", 3] if s.choices is not None else GOOD[s.kind] + BAD.get(s.kind, [])
    if s.name == "pages_per_lane":
        values = ["auto", "2048", "9,10", "x,1"]
    for v in values:
        try:
            want = option.process_value(ctx, (v,) if s.multiple else v)
        except click.BadParameter as e:
            with pytest.raises(InputError) as got:
                s.convert(v)
            assert str(got.value) == e.message, (s.name, v)
            continue
        got = s.convert(v)
        assert (got, type(got)) == ((want[0], type(want[0])) if s.multiple else (want, type(want))), (
            s.name,
            v,
        )


def test_convert_in_examples():
    table = by_key()
    assert table["pages_per_lane"].convert(2048) == 2048
    assert table["pages_per_lane"].convert("9,10,10,10") == (9, 10, 10, 10)
    assert table["spec_accept_rate"].convert(1) == 1.0 and type(table["spec_accept_rate"].convert(1)) is float
    with pytest.raises(InputError, match=r"^'ring' is not one of 'zigzag', 'interleave', 'all'\.$"):
        table["cp_strategy"].convert("ring")
    with pytest.raises(InputError, match=r"^'a' is not a valid float\.$"):
        table["start"].convert("a")


def test_parse_pages_per_lane():
    assert parse_pages_per_lane("16384") == 16384
    assert parse_pages_per_lane("9,10,10,10") == (9, 10, 10, 10)
    assert parse_pages_per_lane("auto") is None and parse_pages_per_lane(None) is None
    with pytest.raises(InputError, match=r"^'x,1' is not an int or a comma-separated list of ints$"):
        parse_pages_per_lane("x,1")


def test_expand_all_expands_checks_and_keeps_each_name_once_in_order_given():
    assert expand_all(["balanced", "all", "rotation"], OWNER_POLICIES, "policy") == [
        "balanced",
        "rotation",
        "legacy",
    ]
    assert expand_all(["interleaved", "all"], KV_STORAGE_DESIGNS, "kv storage") == [
        "interleaved",
        "owner-lane",
        "replicated",
        "interleaved-vblock",
    ]
    assert expand_all(("interleave", "interleave"), CP_STRATEGIES, "cp_strategy") == ["interleave"]
    assert expand_all([], OWNER_POLICIES, "policy") == []


@pytest.mark.parametrize(
    "names, allowed, what, message",
    [
        (
            ["nope"],
            OWNER_POLICIES,
            "policy",
            "policy 'nope' is unknown; use one of rotation, legacy, balanced or all",
        ),
        (
            ["owner-lane", "striped"],
            KV_STORAGE_DESIGNS,
            "kv storage",
            "kv storage 'striped' is unknown; use one of owner-lane, replicated, interleaved, "
            "interleaved-vblock or all",
        ),
        (
            ["zigzag", "ring"],
            CP_STRATEGIES,
            "cp_strategy",
            "cp_strategy 'ring' is unknown; use one of zigzag, interleave or all",
        ),
    ],
)
def test_expand_all_names_the_unknown_name(names, allowed, what, message):
    with pytest.raises(ConfigError) as e:
        expand_all(names, allowed, what)
    assert str(e.value) == message


def test_one_message_for_an_unknown_name_everywhere():
    # check_name is expand_all's check; the storage factory and SimConfig raise its words.
    with pytest.raises(ConfigError) as e:
        check_name("all", KV_STORAGE_DESIGNS, "kv storage")
    with pytest.raises(ConfigError) as built:
        build_storage("all", SimConfig(), "balanced", None)
    assert (
        str(built.value)
        == str(e.value)
        == (
            "kv storage 'all' is unknown; use one of owner-lane, replicated, interleaved, interleaved-vblock or all"
        )
    )
    with pytest.raises(
        ConfigError, match="^cp_strategy 'all' is unknown; use one of zigzag, interleave or all$"
    ):
        SimConfig(cp_strategy="all")


def test_config_of_and_workload_of_make_the_replay_of_the_settings():
    options = {**defaults(), "workload": "short-prompts", "max_requests": 5, "cost_model": "illustrative"}
    spec = workload_of(options)
    assert len(spec.requests) == 5
    config = config_of({**options, "cp_strategies": ("all",), "cp_size": 4}, spec)
    assert (config.cp_size, config.page_size, config.cp_strategy, config.measured) == (4, 64, "zigzag", None)
    assert config_of({**options, "cp_strategies": ("interleave",)}, spec).cp_strategy == "interleave"
    with pytest.raises(InputError, match=r"^give --trace or --workload, not both \(got --workload x\)$"):
        workload_of({**options, "trace": "t.jsonl", "workload": "x"})


def test_measured_spec():
    assert measured_spec("measured", None, None, None, None) == MeasuredSpec(
        gpu=DEFAULT_GPU, model=DEFAULT_MODEL, backend=DEFAULT_BACKEND, ep_size=None
    )
    assert measured_spec("illustrative", None, None, None, None) is None
    with pytest.raises(InputError) as e:
        measured_spec("illustrative", "h100", None, None, 2)
    assert str(e.value) == (
        "--gpu, --ep-size apply only to --cost-model measured: drop them or use --cost-model measured"
    )


def test_one_page_size_default():
    from cpkv.cli.plan import plan
    from cpkv.sim.scenarios import short_prompts_workload
    from cpkv.sim.workload import build_workload

    defaults_seen = [
        SimConfig.page_size,
        by_key()["page_size"].default,
        inspect.signature(build_workload).parameters["page_size"].default,
        inspect.signature(short_prompts_workload).parameters["page_size"].default,
        next(p.default for p in plan.params if p.name == "page_size"),
    ]
    assert defaults_seen == [DEFAULT_PAGE_SIZE] * 5


def test_a_setting_added_to_the_table_is_a_flag():
    # The CLI is built from the table when the command is defined; the builder makes the same option.
    from cpkv.cli.simulate import setting_option

    s = settings.Setting("max_running", "--max-running", int, None, "Most requests at once.", CONFIG)

    @click.command()
    @setting_option(s)
    def cmd(**kw):
        return kw

    assert cmd.make_context("cmd", ["--max-running", "7"]).params == {"max_running": 7}
    assert [p.opts for p in cmd.params] == [["--max-running"]]
