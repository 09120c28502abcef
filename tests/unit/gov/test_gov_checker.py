"""The governance checker (``python -m cpkv.gov check``) on small repositories built in tmp_path.

Each test starts from a valid fixture (one RFC with a normative clause C-A and an informative C-B, one
work item W1, one test file naming C-A), breaks one thing, and asserts the exact problem lines. The
schemas are the repository's own ``gov/schema/*.schema.json``, copied into the fixture.
"""

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.gov import run_check
from cpkv.gov.__main__ import main
from cpkv.gov.testscan import scan_file

pytestmark = pytest.mark.unit

REPO_SCHEMAS = Path(__file__).resolve().parents[3] / "gov" / "schema"
RFC = "gov/rfc/RFC-0001/rfc.toml"
C_A = "gov/rfc/RFC-0001/clauses/C-A.toml"
C_B = "gov/rfc/RFC-0001/clauses/C-B.toml"
W1 = "gov/work/W1-thing.toml"
TEST_A = "tests/test_a.py"


def rfc_toml(
    status="accepted",
    phase="impl",
    sections='[[sections]]\ntitle = "Core"\nclauses = ["C-A", "C-B"]',
    version="0.1.0",
    rfc_id="RFC-0001",
):
    return (
        f'#:schema ../../schema/rfc.schema.json\n[govctl]\nid = "{rfc_id}"\ntitle = "Test RFC"\n'
        f'version = "{version}"\nstatus = "{status}"\nphase = "{phase}"\nowners = ["me"]\n\n'
        f'[content]\nsummary = "A fixture."\n\n{sections}\n'
    )


def clause_toml(cid, kind="normative", status="active", since="0.1.0", extra="", drop=None):
    fields = {
        "id": f'"{cid}"',
        "title": '"A clause"',
        "kind": f'"{kind}"',
        "status": f'"{status}"',
        "since": f'"{since}"',
        "tags": '["core"]',
    }
    fields.pop(drop, None)
    body = "\n".join(f"{k} = {v}" for k, v in fields.items())
    header = "#:schema ../../../schema/clause.schema.json"
    return f'{header}\n[govctl]\n{body}\n{extra}\n[content]\ntext = "Must hold."\n'


def work_toml(wid="W1", status="active", clauses='["C-A"]', items=((True, f'["{TEST_A}::test_a"]'),)):
    checklist = "".join(
        f'\n[[content.checklist]]\ntext = "step {i}"\ndone = {str(done).lower()}\ntests = {tests}\n'
        for i, (done, tests) in enumerate(items)
    )
    return (
        f'#:schema ../schema/work.schema.json\n[govctl]\nid = "{wid}"\ntitle = "Work"\nstatus = "{status}"\n'
        f'issue = 1\nclauses = {clauses}\n\n[content]\ndescription = "Do it."\n{checklist}'
    )


TEST_A_SOURCE = """\
import pytest


@pytest.mark.clause("C-A")
def test_a():
    assert 1 + 1 == 2
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(REPO_SCHEMAS, tmp_path / "gov" / "schema")
    write(tmp_path, RFC, rfc_toml())
    write(tmp_path, C_A, clause_toml("C-A"))
    write(tmp_path, C_B, clause_toml("C-B", kind="informative"))
    write(tmp_path, W1, work_toml())
    write(tmp_path, TEST_A, TEST_A_SOURCE)
    return tmp_path


def problems(root: Path, **kwargs) -> list[str]:
    return [str(p) for p in run_check(root, **kwargs).problems]


def test_valid_fixture_passes(repo):
    result = run_check(repo)
    assert [str(p) for p in result.problems] == []
    assert result.links == {"C-A": ["tests/test_a.py::test_a"], "C-B": []}
    assert result.summary() == "OK: 1 RFC(s), 2 clauses (1 normative), 1 work items, 1 clause-linked tests"


# --- schema violations -------------------------------------------------------------------------------


def test_bad_work_item_id(repo):
    write(repo, W1, work_toml(wid="W-1"))
    assert problems(repo) == [f"{W1}: govctl.id: 'W-1' does not match '^W[1-9][0-9]*$'"]


def test_bad_clause_id_drops_the_clause_and_its_references(repo):
    # The invalid clause is not a clause: the work item and the test that name C-A now name nothing.
    write(repo, C_A, clause_toml("C-a"))
    assert problems(repo) == [
        f"{C_A}: govctl.id: 'C-a' does not match '^C-[A-Z0-9-]+$'",
        f"{W1}: clauses lists unknown clause 'C-A'",
        f"{TEST_A}:4: clause mark names unknown clause 'C-A'",
    ]


def test_missing_field(repo):
    write(repo, C_B, clause_toml("C-B", kind="informative", drop="since"))
    assert problems(repo) == [f"{C_B}: govctl: 'since' is a required property"]


def test_bad_enum_and_extra_field(repo):
    write(repo, C_B, clause_toml("C-B", kind="advisory", extra='owner = "x"'))
    assert problems(repo) == [
        f"{C_B}: govctl: Additional properties are not allowed ('owner' was unexpected)",
        f"{C_B}: govctl.kind: 'advisory' is not one of ['normative', 'informative']",
    ]


def test_checklist_field_path_is_readable(repo):
    write(repo, W1, work_toml(items=((True, '["not a node id"]'),)))
    assert problems(repo) == [
        f"{W1}: content.checklist[0].tests[0]: 'not a node id' does not match "
        "'^[^:\\\\s]+\\\\.py(::[A-Za-z_][A-Za-z0-9_]*)+(\\\\[.*\\\\])?$'"
    ]


def test_wrong_schema_header(repo):
    write(repo, C_B, clause_toml("C-B", kind="informative").replace("../../../schema/", "../schema/"))
    assert problems(repo) == [f"{C_B}: first line must be '#:schema ../../../schema/clause.schema.json'"]


def test_invalid_toml(repo):
    write(repo, C_B, clause_toml("C-B", kind="informative") + "broken = \n")
    # The parser's own wording follows the prefix; it must locate the bad line.
    (found,) = problems(repo)
    assert found.startswith(f"{C_B}: invalid TOML: ")
    assert "line 12" in found


def test_missing_schema_file_stops_the_check(repo):
    (repo / "gov" / "schema" / "work.schema.json").unlink()
    result = run_check(repo)
    assert [str(p) for p in result.problems] == ["gov/schema/work.schema.json: schema file is missing"]
    assert result.summary() == (
        "FAILED: 1 problem(s); 0 RFC(s), 0 clauses (0 normative), 0 work items, 0 clause-linked tests"
    )


# --- references ----------------------------------------------------------------------------------------


def test_unknown_clause_in_work_item(repo):
    write(repo, W1, work_toml(clauses='["C-A", "C-NOPE"]'))
    assert problems(repo) == [f"{W1}: clauses lists unknown clause 'C-NOPE'"]


def test_superseded_by_unknown_clause(repo):
    write(
        repo,
        C_B,
        clause_toml("C-B", kind="informative", status="superseded", extra='superseded_by = "C-GONE"'),
    )
    assert problems(repo) == [f"{C_B}: superseded_by names unknown clause 'C-GONE'"]


def test_superseded_by_must_name_an_active_clause(repo):
    write(repo, C_A, clause_toml("C-A", status="deprecated"))
    write(
        repo, C_B, clause_toml("C-B", kind="informative", status="superseded", extra='superseded_by = "C-A"')
    )
    assert problems(repo) == [f"{C_B}: superseded_by names 'C-A', which is deprecated, not active"]


def test_superseded_by_active_clause_passes(repo):
    write(
        repo, C_B, clause_toml("C-B", kind="informative", status="superseded", extra='superseded_by = "C-A"')
    )
    assert problems(repo) == []


def test_superseded_status_and_superseded_by_go_together(repo):
    write(repo, C_A, clause_toml("C-A", status="superseded"))
    write(repo, C_B, clause_toml("C-B", kind="informative", extra='superseded_by = "C-A"'))
    assert problems(repo) == [
        f"{C_A}: status is 'superseded' but superseded_by is not set",
        f"{C_B}: superseded_by is set but status is 'active', not 'superseded'",
        f"{C_B}: superseded_by names 'C-A', which is superseded, not active",
    ]


def test_rfc_sections_match_the_clause_files(repo):
    sections = (
        '[[sections]]\ntitle = "One"\nclauses = ["C-A", "C-X"]\n'
        '[[sections]]\ntitle = "Two"\nclauses = ["C-A"]'
    )
    write(repo, RFC, rfc_toml(sections=sections))
    assert problems(repo) == [
        f"{C_B}: clause 'C-B' is not listed in any section of {RFC}",
        f"{RFC}: section 'One' lists unknown clause 'C-X'",
        f"{RFC}: clause 'C-A' is listed in sections 'One' and 'Two'",
    ]


def test_clause_since_newer_than_rfc_version(repo):
    write(repo, C_B, clause_toml("C-B", kind="informative", since="0.10.0"))
    write(repo, RFC, rfc_toml(version="0.9.1"))
    assert problems(repo) == [f"{C_B}: since 0.10.0 is newer than RFC-0001 version 0.9.1"]


def test_file_names_match_ids(repo):
    (repo / C_B).unlink()
    write(repo, "gov/rfc/RFC-0001/clauses/C-BEE.toml", clause_toml("C-B", kind="informative"))
    (repo / W1).unlink()
    write(repo, "gov/work/W10.toml", work_toml(wid="W1"))
    write(repo, RFC, rfc_toml(sections='[[sections]]\ntitle = "Core"\nclauses = ["C-A", "C-BEE"]'))
    assert problems(repo) == [
        "gov/rfc/RFC-0001/clauses/C-BEE.toml: id 'C-B' does not match the file name; name the file C-B.toml",
        "gov/rfc/RFC-0001/clauses/C-BEE.toml: clause 'C-B' is not listed in any section of " + RFC,
        "gov/work/W10.toml: id 'W1' does not match the file name; name the file W1.toml or W1-<slug>.toml",
    ]


def test_rfc_directory_needs_rfc_toml(repo):
    write(repo, "gov/rfc/RFC-0002/clauses/C-Z.toml", clause_toml("C-Z", kind="informative"))
    assert problems(repo) == ["gov/rfc/RFC-0002: rfc.toml is missing"]


# --- duplicates ----------------------------------------------------------------------------------------


def test_duplicate_clause_id_across_rfcs(repo):
    write(
        repo,
        "gov/rfc/RFC-0002/rfc.toml",
        rfc_toml(rfc_id="RFC-0002", sections='[[sections]]\ntitle = "S"\nclauses = ["C-A"]'),
    )
    write(repo, "gov/rfc/RFC-0002/clauses/C-A.toml", clause_toml("C-A"))
    assert problems(repo) == [
        f"gov/rfc/RFC-0002/clauses/C-A.toml: duplicate id 'C-A', first defined in {C_A}"
    ]


def test_duplicate_work_item_id(repo):
    write(repo, "gov/work/W1-other.toml", work_toml())
    # Files are read in sorted order: W1-other.toml comes before W1-thing.toml.
    assert problems(repo) == [f"{W1}: duplicate id 'W1', first defined in gov/work/W1-other.toml"]


def test_duplicate_rfc_id(repo):
    write(repo, "gov/rfc/RFC-0002/rfc.toml", rfc_toml(sections='[[sections]]\ntitle = "S"\nclauses = []'))
    assert problems(repo) == [
        f"gov/rfc/RFC-0002/rfc.toml: duplicate id 'RFC-0001', first defined in {RFC}",
        "gov/rfc/RFC-0002/rfc.toml: id 'RFC-0001' does not match the directory name 'RFC-0002'",
    ]


# --- impossible states ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "phase", "allowed"),
    [
        ("draft", "stable", "spec"),
        ("proposed", "impl", "spec"),
        ("accepted", "stable", "spec, impl, test"),
        ("final", "spec", "impl, test, stable"),
    ],
)
def test_impossible_rfc_state(repo, status, phase, allowed):
    write(repo, RFC, rfc_toml(status=status, phase=phase))
    assert problems(repo) == [f"{RFC}: status '{status}' does not allow phase '{phase}' (allowed: {allowed})"]


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ("draft", "spec"),
        ("accepted", "test"),
        ("final", "stable"),
        ("deprecated", "spec"),
    ],
)
def test_possible_rfc_state(repo, status, phase):
    write(repo, RFC, rfc_toml(status=status, phase=phase))
    assert problems(repo) == []


def test_done_work_item_with_unchecked_items(repo):
    items = ((True, f'["{TEST_A}::test_a"]'), (False, "[]"), (False, "[]"))
    write(repo, W1, work_toml(status="done", items=items))
    assert problems(repo) == [
        f"{W1}: status is 'done' but checklist[1] is not checked",
        f"{W1}: status is 'done' but checklist[2] is not checked",
    ]


def test_active_work_item_may_have_unchecked_items(repo):
    write(repo, W1, work_toml(items=((True, f'["{TEST_A}::test_a"]'), (False, "[]"))))
    assert problems(repo) == []


def test_checked_item_needs_a_test(repo):
    write(repo, W1, work_toml(items=((True, "[]"),)))
    assert problems(repo) == [f"{W1}: checklist[0] is checked but names no test"]


def test_work_item_needs_a_checklist(repo):
    write(
        repo,
        W1,
        work_toml(items=()).replace('description = "Do it."', 'description = "Do it."\nchecklist = []'),
    )
    (found,) = problems(repo)
    assert found.startswith(f"{W1}: content.checklist: [] ")  # jsonschema's wording of minItems follows


# --- test ids in checklists -----------------------------------------------------------------------------


def test_unknown_test_ids_in_checklist(repo):
    tests = f'["{TEST_A}::test_missing", "tests/test_gone.py::test_a", "{TEST_A}::test_a[1-2]"]'
    write(repo, W1, work_toml(items=((False, tests),)))
    assert problems(repo) == [
        f"{W1}: checklist[0] names unknown test '{TEST_A}::test_missing' (no such test in the file)",
        f"{W1}: checklist[0] names unknown test 'tests/test_gone.py::test_a' (no such file)",
    ]


def test_checklist_test_outside_the_tests_dir_resolves(repo):
    write(
        repo,
        "bench/test_speed.py",
        "def test_speed():\n    pass\n\n\nclass TestX:\n    def test_y(self):\n        pass\n",
    )
    ids = ["test_speed", "TestX::test_y", "TestX"]
    tests = "[" + ", ".join(f'"bench/test_speed.py::{i}"' for i in ids) + "]"
    write(repo, W1, work_toml(items=((True, f'["{TEST_A}::test_a"]'), (False, tests))))
    # A class is not a test function; its marks outside tests/ do not count as clause links.
    assert problems(repo) == [
        f"{W1}: checklist[1] names unknown test 'bench/test_speed.py::TestX' (no such test in the file)"
    ]


# --- clause-to-test links ------------------------------------------------------------------------------


def test_orphan_normative_clause(repo):
    write(repo, TEST_A, "def test_a():\n    assert True\n")
    assert problems(repo) == [f"{C_A}: active normative clause 'C-A' is not named by any test"]


@pytest.mark.parametrize(
    ("kind", "status"), [("informative", "active"), ("normative", "deprecated"), ("normative", "proposed")]
)
def test_only_active_normative_clauses_need_tests(repo, kind, status):
    write(repo, TEST_A, "def test_a():\n    assert True\n")
    write(repo, W1, work_toml(clauses="[]"))
    write(repo, C_A, clause_toml("C-A", kind=kind, status=status))
    assert problems(repo) == []


def test_superseded_by_must_not_name_a_proposed_clause(repo):
    write(repo, C_A, clause_toml("C-A", status="proposed"))
    write(
        repo, C_B, clause_toml("C-B", kind="informative", status="superseded", extra='superseded_by = "C-A"')
    )
    assert problems(repo) == [f"{C_B}: superseded_by names 'C-A', which is proposed, not active"]


def test_test_names_unknown_clause(repo):
    write(repo, TEST_A, TEST_A_SOURCE + '\n\n@pytest.mark.clause("C-A", "C-Z")\ndef test_b():\n    pass\n')
    assert problems(repo) == [f"{TEST_A}:9: clause mark names unknown clause 'C-Z'"]


def test_clause_mark_needs_string_literals(repo):
    write(
        repo,
        TEST_A,
        TEST_A_SOURCE + '\n\nCID = "C-A"\n\n\n@pytest.mark.clause(CID)\ndef test_b():\n    pass\n',
    )
    assert problems(repo) == [f"{TEST_A}:12: clause mark must name clause ids as string literals"]


def test_unparsable_test_file(repo):
    write(repo, "tests/test_broken.py", "def test_x(:\n    pass\n")
    assert problems(repo) == ["tests/test_broken.py:1: cannot parse: invalid syntax"]


def test_missing_tests_dir(repo):
    assert problems(repo, tests_dir="no_tests") == [
        f"{C_A}: active normative clause 'C-A' is not named by any test",
        "no_tests: tests directory does not exist",
    ]


MARK_FORMS = """\
import pytest
from pytest import mark

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-M")]


@mark.clause("C-F")
async def test_plain():
    pass


def helper_not_a_test():
    pass


@pytest.mark.clause("C-K")
class TestGroup:
    pytestmark = pytest.mark.clause("C-P")

    @pytest.mark.clause("C-F")
    def test_method(self):
        pass

    class TestInner:
        def test_deep(self):
            pass

    def not_a_test(self):
        pass


class Helper:
    @pytest.mark.clause("C-H")
    def test_ignored(self):
        pass
"""


def test_scanner_collects_every_mark_form(tmp_path):
    write(tmp_path, "tests/test_forms.py", MARK_FORMS)
    scanned = scan_file(tmp_path / "tests/test_forms.py", tmp_path)
    got = {node: sorted({m.clause for m in marks}) for node, marks in scanned.tests.items()}
    assert got == {
        "tests/test_forms.py::test_plain": ["C-F", "C-M"],
        "tests/test_forms.py::TestGroup::test_method": ["C-F", "C-K", "C-M", "C-P"],
        "tests/test_forms.py::TestGroup::TestInner::test_deep": ["C-K", "C-M", "C-P"],
    }
    assert scanned.problems == []


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["C-A", "C-B", "C-LONG-NAME-2"]), max_size=3, unique=True),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.sampled_from(["C-A", "C-B"]), max_size=2, unique=True),
)
def test_scanner_recovers_generated_marks(tmp_path_factory, per_test, module_marks):
    # Generate a module whose i-th test carries per_test[i] as decorators and module_marks as pytestmark;
    # each test must link exactly to the union of both.
    src = ["import pytest", f"pytestmark = [{', '.join(f'pytest.mark.clause({c!r})' for c in module_marks)}]"]
    for i, cids in enumerate(per_test):
        src += [f"@pytest.mark.clause({c!r})" for c in cids] + [f"def test_{i}():", "    pass", ""]
    root = tmp_path_factory.mktemp("scan")
    write(root, "tests/test_gen.py", "\n".join(src))
    scanned = scan_file(root / "tests/test_gen.py", root)
    got = {node: {m.clause for m in marks} for node, marks in scanned.tests.items()}
    assert got == {
        f"tests/test_gen.py::test_{i}": set(cids) | set(module_marks) for i, cids in enumerate(per_test)
    }


# --- SPEC coverage ---------------------------------------------------------------------------------------


def test_spec_clause_without_clause_file(repo):
    spec = (
        "**C-A.** text. See C-MISSING and (C-B); the zigzag rank is 2C-1-s; clause ids look like `C-...`.\n"
    )
    write(repo, "SPEC.md", spec)
    assert problems(repo, spec="SPEC.md") == [
        "SPEC.md: clause 'C-MISSING' of the spec has no clause file under gov/rfc/"
    ]
    assert problems(repo, spec="nope.md") == ["nope.md: spec file does not exist"]


# --- command line ----------------------------------------------------------------------------------------


def test_cli_ok_from_a_subdirectory(repo, monkeypatch, capsys):
    monkeypatch.chdir(repo / "gov" / "work")
    assert main(["check"]) == 0
    assert (
        capsys.readouterr().out
        == "OK: 1 RFC(s), 2 clauses (1 normative), 1 work items, 1 clause-linked tests\n"
    )


def test_cli_prints_problems_and_fails(repo, capsys):
    write(repo, W1, work_toml(clauses='["C-NOPE"]'))
    assert main(["check", "--root", str(repo)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{W1}: clauses lists unknown clause 'C-NOPE'",
        "FAILED: 1 problem(s); 1 RFC(s), 2 clauses (1 normative), 1 work items, 1 clause-linked tests",
    ]


def test_cli_report(repo, capsys):
    write(
        repo,
        "tests/test_more.py",
        'import pytest\n\n\n@pytest.mark.clause("C-A")\ndef test_more():\n    pass\n',
    )
    assert main(["check", "--root", str(repo), "--report"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "clause  kind         status  tests",
        "C-A     normative    active  tests/test_a.py::test_a",
        "                             tests/test_more.py::test_more",
        "C-B     informative  active  -",
        "OK: 1 RFC(s), 2 clauses (1 normative), 1 work items, 2 clause-linked tests",
    ]


def test_cli_tests_option(repo, capsys):
    shutil.move(repo / "tests", repo / "checks")
    write(repo, W1, work_toml(items=((True, '["checks/test_a.py::test_a"]'),)))
    assert main(["check", "--root", str(repo), "--tests", "checks"]) == 0
    assert capsys.readouterr().out.startswith("OK: ")


def test_cli_without_gov_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 2
    assert capsys.readouterr().err == "cpkv: error: no gov/ directory in the CWD or above; pass --root DIR\n"


def test_cli_requires_a_command(capsys):
    assert main([]) == 2
    assert "required: command" in capsys.readouterr().err


def test_broken_schema_file_stops_the_check(repo):
    write(repo, "gov/schema/rfc.schema.json", '{"type": 5}')
    write(repo, "gov/schema/clause.schema.json", "{not json")
    found = problems(repo)
    assert [line.split(": ", 2)[:2] for line in found] == [
        ["gov/schema/clause.schema.json", "invalid JSON"],
        ["gov/schema/rfc.schema.json", "not a valid draft 2020-12 schema"],
    ]
