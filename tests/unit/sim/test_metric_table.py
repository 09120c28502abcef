"""One metric table (``cpkv.sim.metrics.METRICS``): the code fills exactly its names, ``docs/metrics.md``
defines exactly its names with its units, and the report's fields and the sweep's rules are derived from it.
Adding a metric is one entry there plus its docs row; a name on one side only fails here."""

import re
from pathlib import Path

import pytest

from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.metrics import CORE, METRICS, RUN, SPEC, STORAGE, Metric, metric_names
from cpkv.sim.rejection import Rejection, budget_reason, lane_reason, pool_reason
from cpkv.sim.replay import replay
from cpkv.sim.report import REPORT_FIELDS, SPEC_DECODE_FIELDS, STORAGE_FIELDS
from cpkv.sim.storage import KV_STORAGE_DESIGNS
from cpkv.sim.trace import Request
from cpkv.sim.workload import WorkloadSpec, build_workload
from cpkv.sweep.groups import RULES

pytestmark = pytest.mark.unit

METRICS_MD = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text(encoding="utf-8")

DOC_TABLE_GROUPS = ({CORE, RUN}, {SPEC}, {STORAGE})
"""The groups whose metrics each metric table of docs/metrics.md defines, in the file's order: the report's
metrics, then those with ``--spec-draft-tokens``, then the KV storage designs'."""

SMALL = {"cp_size": 4, "page_size": 16, "pages_per_lane": 512, "chunk_size": 256, "max_batch_tokens": 512}


def doc_tables(text: str) -> list[dict[str, str]]:
    """Each metric table of a docs/metrics.md text, in order: ``{metric: unit}``. A metric table is a markdown
    table whose header's first cell is ``metric`` and last ``unit``; a row defines every backticked name of
    its first cell (``ttft_ms_p50``, ``ttft_ms_p99`` share one) with its last cell as the unit."""
    tables, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
        if lines[i].startswith("|") and header[0] == "metric" and header[-1] == "unit":
            table, i = {}, i + 2  # past the header and its |---| line
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                for name in re.findall(r"`(\w+)`", cells[0]):
                    table[name] = cells[-1]
                i += 1
            tables.append(table)
        else:
            i += 1
    return tables


def docs_disagree(metrics: tuple[Metric, ...], text: str) -> list[str]:
    """Where the table ``metrics`` and a docs/metrics.md ``text`` disagree, one line each (empty: they agree):
    a metric without a docs row, a docs row without a metric, a unit that differs, a row in another group's
    table."""
    tables = doc_tables(text)
    if len(tables) != len(DOC_TABLE_GROUPS):
        return [f"{len(tables)} metric tables in the docs, expected {len(DOC_TABLE_GROUPS)}"]
    documented = {name: (unit, k) for k, table in enumerate(tables) for name, unit in table.items()}
    names = {m.name for m in metrics}
    out = [f"{n} is in the docs only" for n in documented if n not in names]
    for m in metrics:
        if m.name not in documented:
            out.append(f"{m.name} has no docs row")
            continue
        unit, k = documented[m.name]
        if unit != m.unit:
            out.append(f"{m.name}: unit {m.unit!r} in the table, {unit!r} in the docs")
        if m.group not in DOC_TABLE_GROUPS[k]:
            out.append(f"{m.name} ({m.group}) is defined in metric table {k}")
    return out


# --------------------------------------------------------------------------------------------- the docs
def test_docs_define_exactly_the_table_with_its_units():
    assert [len(t) for t in doc_tables(METRICS_MD)] == [
        len(metric_names(group=CORE)) + len(metric_names(group=RUN)),
        len(metric_names(group=SPEC)),
        len(metric_names(group=STORAGE)),
    ]
    assert docs_disagree(METRICS, METRICS_MD) == []


def test_the_docs_check_catches_a_name_on_one_side_only():
    row = next(line for line in METRICS_MD.splitlines() if line.startswith("| `evicted_pages` |"))
    without = METRICS_MD.replace(row + "\n", "")
    assert docs_disagree(METRICS, without) == ["evicted_pages has no docs row"]
    extra = METRICS_MD.replace(row, row + "\n| `evicted_bytes` | bytes evicted | bytes |")
    assert docs_disagree(METRICS, extra) == ["evicted_bytes is in the docs only"]
    added = (*METRICS, Metric("evicted_bytes", CORE, "sum", "bytes", None))
    assert docs_disagree(added, METRICS_MD) == ["evicted_bytes has no docs row"]
    assert docs_disagree(added, extra) == []
    wrong_unit = METRICS_MD.replace(row, row.replace("| pages |", "| blocks |"))
    assert docs_disagree(METRICS, wrong_unit) == [
        "evicted_pages: unit 'pages' in the table, 'blocks' in the docs"
    ]
    spec_row = next(line for line in METRICS_MD.splitlines() if line.startswith("| `draft_pages_released` |"))
    moved = METRICS_MD.replace(spec_row + "\n", "").replace(row, row + "\n" + spec_row)
    assert docs_disagree(METRICS, moved) == ["draft_pages_released (spec) is defined in metric table 0"]


# --------------------------------------------------------------------------------------------- the table
def test_names_are_unique_and_the_derived_lists_follow_the_table():
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert {m.group for m in METRICS} == {CORE, SPEC, STORAGE, RUN}
    assert REPORT_FIELDS == tuple(m.name for m in METRICS if m.column == CORE)
    assert SPEC_DECODE_FIELDS == tuple(m.name for m in METRICS if m.column == SPEC)
    assert STORAGE_FIELDS == tuple(m.name for m in METRICS if m.column == STORAGE)
    assert (
        REPORT_FIELDS[:2] == ("requests_total", "requests_finished")
        and SPEC_DECODE_FIELDS[0] == "leaked_pages"
    )


def test_sweep_rules_are_the_tables_and_name_only_its_metrics():
    assert RULES == {m.name: m.combine for m in METRICS}
    simple = {"sum", "max", "any", "same", "lanes-max", "lanes-sum", "counts", "merged", "per-group"}
    for m in METRICS:
        if isinstance(m.combine, tuple):
            kind, *args = m.combine
            assert kind in ("pooled", "weighted", "ratio"), m
            if kind != "pooled":
                assert all(a in RULES for a in args), m  # a weight or a ratio's parts are metrics too
        else:
            assert m.combine in simple, m


# ------------------------------------------------------------------------------ the code fills the table
@pytest.mark.parametrize("design", KV_STORAGE_DESIGNS)
def test_each_dict_fills_exactly_its_groups_names(design):
    spec = build_workload("synthetic", num_requests=6, seed=1)
    run = PolicyRun(SimConfig(**SMALL, spec_draft_tokens=2), "balanced", spec.requests, kv_storage=design)
    metrics = run.run().metrics
    assert set(run.drafts.metrics()) == set(metric_names(group=SPEC))
    assert set(run.storage.metrics(run.counters)) == set(metric_names(group=STORAGE))
    assert set(metrics) == {
        *metric_names(group=CORE),
        *metric_names(group=SPEC),
        *metric_names(group=STORAGE),
    }


def test_without_drafts_policy_metrics_fills_core_and_storage_and_the_runner_adds_run():
    # the second request needs more pages than the pool has: rejected ("pool")
    reqs = (Request(0, 0.0, 100, 2, (1,)), Request(1, 5.0, 5000, 1, (2,)))
    cfg = SimConfig(cp_size=2, page_size=16, pages_per_lane=64)
    metrics = PolicyRun(cfg, "rotation", reqs).run().metrics
    assert set(metrics) == {*metric_names(group=CORE), *metric_names(group=STORAGE)}
    workload = WorkloadSpec(name="trace", requests=reqs, chunk_pages=None, description="test")
    result = replay(cfg, workload, ["rotation"], progress=False, table=False)
    assert set(result.results[0].metrics) == set(metric_names()) - set(metric_names(group=SPEC))
    assert metrics["rejection_reasons"] == {"pool": 1}
    assert metrics["rejections"] == {"1": "pool: needs 313 pages but the pool has 127 usable pages"}


# ---------------------------------------------------------------------------------------------- reasons
def test_a_rejection_is_a_code_and_a_detail_printed_as_before():
    assert pool_reason(125, 15) == Rejection("pool", "needs 125 pages but the pool has 15 usable pages")
    assert str(pool_reason(125, 15)) == "pool: needs 125 pages but the pool has 15 usable pages"
    assert str(lane_reason("rotation", 3, 9, "its own pages")) == (
        "lane: policy rotation puts the next page on lane 3, whose 9 usable pages hold its own pages"
    )
    assert budget_reason(29, 16).code == "logits_budget"
    assert str(budget_reason(29, 16)) == (
        "logits_budget: a one-token chunk at position 29 needs 30 logits elements on one rank, over the budget of 16"
    )
