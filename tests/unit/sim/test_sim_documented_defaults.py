"""One source for every default: docs/metrics.md's defaults table, the numbers the docs state and
the CLI's defaults agree with ``SimConfig`` / ``CostModel``."""

import dataclasses
import re
from pathlib import Path

import click
import numpy as np
import pytest

from cpkv.cli import app
from cpkv.cost.spec import MeasuredSpec
from cpkv.sim.config import CostModel, SimConfig
from cpkv.sim.metrics import BUSY_FRACTION, lane_metrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
METRICS_MD = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _documented() -> dict[str, tuple[str, str]]:
    """``{setting: (flag, default text)}`` from the table under "## Defaults" in docs/metrics.md."""
    section = METRICS_MD.split("## Defaults", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| (`--[\w-]+`|-) \| ([^|]+?) \|", section, flags=re.M)
    return {name: (flag.strip("`"), default.strip()) for name, flag, default in rows}


def _code_defaults() -> dict[str, object]:
    sim = SimConfig()
    out = {f.name: getattr(sim, f.name) for f in dataclasses.fields(sim) if f.name != "cost"}
    out.update({f"cost.{f.name}": getattr(sim.cost, f.name) for f in dataclasses.fields(CostModel)})
    out.update(
        {f"measured.{f.name}": getattr(MeasuredSpec(), f.name) for f in dataclasses.fields(MeasuredSpec)}
    )
    return out


def _parse(text: str, like: object) -> object:
    if isinstance(like, bool):
        return {"true": True, "false": False}[text]
    if like is None:  # "None (what it means)"
        return None if text.split(" ", 1)[0].rstrip(";") == "None" else text
    return type(like)(text)


def test_every_default_is_documented_with_the_codes_value():
    documented, code = _documented(), _code_defaults()
    assert sorted(documented) == sorted(code)  # every setting once, nothing stale
    for name, value in code.items():
        assert _parse(documented[name][1], value) == value, name


def test_cost_model_defaults_stated_in_prose_match():
    # The case: docs said 0.02 ms/token and 2e-7 ms/pair while the code used 0.1 and 2e-6.
    assert "0.02 ms/token" not in METRICS_MD and "2e-7" not in METRICS_MD
    cost = CostModel()
    documented = _documented()
    assert float(documented["cost.linear_ms_per_token"][1]) == cost.linear_ms_per_token
    assert float(documented["cost.attn_ms_per_pair"][1]) == cost.attn_ms_per_pair


def test_documented_flags_exist_and_have_the_codes_default():
    command = app.commands["simulate"]
    ctx = click.Context(command)
    params = {p.opts[0]: p for p in command.params if p.opts}
    code = _code_defaults()
    for name, (flag, text) in _documented().items():
        if flag == "-":
            continue
        param = params[flag]
        default = param.get_default(ctx)
        if name == "measured":  # the library prices with the illustrative constants, the CLI measures
            assert code[name] is None and default == "measured" and text.endswith("`cpkv simulate`: measured")
        elif default is not None:  # None: derived from the workload (help text names the default)
            assert (default[0] if param.multiple else default) == code[name], (
                flag
            )  # --cp-strategy: one default
        elif code[name] is None:  # None: means what the docs say in parentheses, and the help text too
            assert f"[{text.split('(')[1].rstrip(')').replace('_', '-')}]" in param.help.replace("--", ""), (
                flag
            )
        else:
            assert f"{code[name]}" in param.help, flag


def test_readme_option_numbers_are_the_defaults():
    line = next(p for p in README.split("\n\n") if p.startswith("Options: `--cp-size"))
    code = _code_defaults()
    pairs = re.findall(r"--([\w-]+) (\d+)", line)
    assert pairs  # the paragraph still gives numbers
    for flag, number in pairs:
        assert int(number) == code[flag.replace("-", "_")], flag


def test_busy_threshold_stated_in_docs_is_the_codes():
    (factor,) = re.findall(r"mean_r used_r\(t\) >= ([\d.]+) \* Q", METRICS_MD)
    assert float(factor) == BUSY_FRACTION
    # and it is the threshold lane_imbalance_mean applies: a step at exactly factor * Q counts, below not
    Q = 1000
    at = np.array([[200, 0, 0, 0, 0, 0, 0, 0, 0, 0]])  # mean 20 = 0.02 Q: not counted
    busy = np.full((1, 10), int(float(factor) * Q))  # mean exactly factor * Q: counted, imbalance 1.0
    skewed = np.array([[float(factor) * Q * 10] + [0] * 9])  # mean factor * Q, imbalance 10
    assert lane_metrics(np.vstack([at, busy]), Q)["lane_imbalance_mean"] == 1.0
    assert lane_metrics(np.vstack([at, skewed]), Q)["lane_imbalance_mean"] == 10.0
