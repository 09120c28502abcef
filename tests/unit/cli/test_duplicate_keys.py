"""A key written twice in one JSON object of an input is refused, naming file, line and key (C-FAIL-FAST):
JSON readers keep the last value without a word, so ``"output_length": 1,
"output_length": 9000`` loaded 9000."""

import json

import pytest

from cpkv.cli import main
from cpkv.sim.trace import TraceError, load_trace

pytestmark = pytest.mark.unit

LINE = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}'
TWICE = '{"timestamp": 0, "input_length": 10, "output_length": 1, "output_length": 9000, "hash_ids": [0]}'


def test_a_trace_line_with_a_duplicate_key_is_refused_naming_file_line_and_key(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(f"{LINE}\n{LINE}\n{TWICE}\n")
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert str(e.value).startswith(f"{path}:3: key 'output_length' appears twice in one object")
    assert main(["simulate", "--trace", str(path), "--cp-size", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}:3: key 'output_length' appears twice" in err[0]


def test_a_repeated_extra_key_is_refused_and_a_string_holding_key_text_is_not(tmp_path):
    extra = '{"timestamp": 0, "note": "a\\": b", "input_length": 10, "output_length": 1, "hash_ids": [0]}'
    twice = '{"timestamp": 0, "x": 1, "input_length": 10, "x" : 2, "output_length": 1, "hash_ids": [0]}'
    ok = tmp_path / "ok.jsonl"
    ok.write_text(f"{extra}\n")
    assert [r.output_length for r in load_trace(ok)] == [1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"{LINE}\n{twice}\n")
    with pytest.raises(TraceError, match=rf"^{bad}:2: key 'x' appears twice"):
        load_trace(bad)


def test_a_batch_object_with_a_duplicate_key_is_refused_naming_file_line_and_key(tmp_path, capsys):
    path = tmp_path / "batch.json"
    path.write_text(
        '[\n  {"prefix_len": 0, "extend_len": 5},\n  {"prefix_len": 0,\n   "extend_len": 1, "extend_len": 9000}\n]\n'
    )
    assert main(["plan", "--batch", str(path), "--cp-size", "2", "--json"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.strip() == (
        f"cpkv: error: {path}:4: key 'extend_len' appears twice in one object (refused: JSON "
        "readers keep the last value without a word)"
    )
    path.write_text(
        json.dumps([{"prefix_len": 0, "extend_len": 5}] * 3)
    )  # the same keys in other objects: fine
    assert main(["plan", "--batch", str(path), "--cp-size", "2", "--json"]) == 0


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"a": 1, "b": {"c": 1, "c": 2}}', "c"),
        ('[{"a": 1}, {"a": 1, "a": 1}]', "a"),
        ('{"a": 1}', None),
        ("not json", None),
        ('{"a": "\\"a\\": 2"}', None),
    ],
)
def test_duplicate_key_finds_a_key_twice_in_one_object_at_any_depth(text, key):
    from cpkv.validate import duplicate_key  # imported here: the reproductions above also run on older trees

    assert duplicate_key(text) == key
