"""Tests of cpkv.sim.trace: the Mooncake trace loader and token ids derived from block ids."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.errors import ConfigError, CpkvError
from cpkv.sim.trace import (
    VOCAB_SIZE,
    Request,
    TraceError,
    load_trace,
    prompt_token_ids,
    splitmix64,
)
from cpkv.sim.workload import workload_stats

pytestmark = pytest.mark.unit

pytestmark = pytest.mark.unit

REAL_TRACE = (
    Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
)

GOOD = {"timestamp": 150, "input_length": 1000, "output_length": 5, "hash_ids": [3, 4]}


def _write(tmp_path: Path, lines: list[str], name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _line(**fields) -> str:
    record = {**GOOD, **fields}
    return json.dumps({k: v for k, v in record.items() if v is not _DROP})


_DROP = object()


# ---------------------------------------------------------------------------------------------- loader


def test_load_good_file(tmp_path):
    lines = [
        _line(timestamp=0, input_length=512, output_length=0, hash_ids=[0]),
        # float timestamp, an extra field (ignored), 513 tokens = one full block + one token
        json.dumps({"timestamp": 2.5, "input_length": 513, "output_length": 7, "hash_ids": [0, 9], "x": 1}),
        _line(timestamp=2.5, input_length=1, output_length=3, hash_ids=[11]),
        "",
        "   ",
    ]
    requests = load_trace(_write(tmp_path, lines))
    assert requests == [
        Request(req_id=0, arrival_ms=0.0, input_length=512, output_length=0, hash_ids=(0,)),
        Request(req_id=1, arrival_ms=2.5, input_length=513, output_length=7, hash_ids=(0, 9)),
        Request(req_id=2, arrival_ms=2.5, input_length=1, output_length=3, hash_ids=(11,)),
    ]
    assert isinstance(requests[0].arrival_ms, float)
    assert isinstance(requests[0].hash_ids, tuple)


def test_load_accepts_crlf_and_no_final_newline(tmp_path):
    path = tmp_path / "crlf.jsonl"
    path.write_bytes((_line(timestamp=1) + "\r\n" + _line(timestamp=2)).encode())
    assert [r.arrival_ms for r in load_trace(path)] == [0.0, 1.0]  # rebased to the first line


def test_max_requests_reads_only_the_first_lines(tmp_path):
    lines = [_line(timestamp=t) for t in range(5)] + ["not json"]
    requests = load_trace(_write(tmp_path, lines), max_requests=3)
    assert [r.req_id for r in requests] == [0, 1, 2]
    assert [r.arrival_ms for r in requests] == [0.0, 1.0, 2.0]
    assert len(load_trace(_write(tmp_path, lines[:5]), max_requests=99)) == 5


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_requests_must_be_positive_int(tmp_path, bad):
    with pytest.raises(ConfigError, match="max_requests"):
        load_trace(_write(tmp_path, [_line()]), max_requests=bad)


MALFORMED = [
    ("invalid_json", '{"timestamp": 0,', """invalid JSON: '{"timestamp": 0,'"""),
    ("not_json", "hello", "invalid JSON: 'hello'"),
    ("not_object", "[1, 2]", "expected a JSON object, got array [1,2]"),
    ("missing_timestamp", _line(timestamp=_DROP), "missing field 'timestamp'"),
    ("missing_input_length", _line(input_length=_DROP), "missing field 'input_length'"),
    ("missing_output_length", _line(output_length=_DROP), "missing field 'output_length'"),
    ("missing_hash_ids", _line(hash_ids=_DROP), "missing field 'hash_ids'"),
    ("timestamp_bool", _line(timestamp=True), "field 'timestamp' must be a number, got boolean true"),
    ("timestamp_str", _line(timestamp="5"), "field 'timestamp' must be a number, got string \"5\""),
    ("timestamp_null", _line(timestamp=None), "field 'timestamp' must be a number, got null"),
    ("timestamp_negative", _line(timestamp=-1), "field 'timestamp' must be >= 0, got integer -1"),
    ("input_float", _line(input_length=1000.0), "field 'input_length' must be an integer, got float 1000.0"),
    ("input_bool", _line(input_length=True), "field 'input_length' must be an integer, got boolean true"),
    ("input_zero", _line(input_length=0, hash_ids=[]), "field 'input_length' must be >= 1, got integer 0"),
    ("input_negative", _line(input_length=-5), "field 'input_length' must be >= 1, got integer -5"),
    ("output_negative", _line(output_length=-3), "field 'output_length' must be >= 0, got integer -3"),
    ("output_str", _line(output_length="7"), "field 'output_length' must be an integer, got string \"7\""),
    ("hash_ids_str", _line(hash_ids="ab"), "field 'hash_ids' must be a list of integers, got string \"ab\""),
    (
        "hash_ids_object",
        _line(hash_ids={"a": 1}),
        "field 'hash_ids' must be a list of integers, got object {\"a\":1}",
    ),
    ("hash_id_bool", _line(hash_ids=[3, False]), "field 'hash_ids[1]' must be an integer, got boolean false"),
    ("hash_id_float", _line(hash_ids=[3.0, 4]), "field 'hash_ids[0]' must be an integer, got float 3.0"),
    ("hash_id_negative", _line(hash_ids=[3, -7]), "field 'hash_ids[1]' must be >= 0, got integer -7"),
    (
        "hash_id_too_big",
        _line(hash_ids=[3, 2**63]),
        f"field 'hash_ids[1]' must be < 2**63, got integer {2**63}",
    ),
    (
        "too_few_blocks",
        _line(input_length=1025, hash_ids=[1, 2]),
        "field 'hash_ids' has 2 block ids but input_length 1025 needs ceil(1025 / 512) = 3",
    ),
    (
        "too_many_blocks",
        _line(input_length=512, hash_ids=[1, 2]),
        "field 'hash_ids' has 2 block ids but input_length 512 needs ceil(512 / 512) = 1",
    ),
    (
        "timestamp_decreasing",
        _line(timestamp=99),
        "field 'timestamp' is 99 ms, before the previous line's 100 ms (timestamps must be non-decreasing)",
    ),
    ("blank_between", "", "blank line (blank lines are allowed only after the last request)"),
    ("whitespace_between", "  \t", "blank line (blank lines are allowed only after the last request)"),
]


@pytest.mark.parametrize(("kind", "bad_line", "what"), MALFORMED, ids=[case[0] for case in MALFORMED])
def test_malformed_line_names_file_line_field_and_value(tmp_path, kind, bad_line, what):
    # The bad line is line 2 of 3, between good lines at 100 and 200 ms (GOOD is at 150 ms).
    path = _write(tmp_path, [_line(timestamp=100), bad_line, _line(timestamp=200)])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}:2: {what}"
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, CpkvError)


def test_error_on_a_late_line_reports_that_line(tmp_path):
    lines = [_line(timestamp=t) for t in range(40)] + [_line(output_length=-1)]
    path = _write(tmp_path, lines)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}:41: field 'output_length' must be >= 0, got integer -1"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}: cannot read trace: No such file or directory"


@pytest.mark.parametrize("text", ["", "\n", "\n  \n\n"])
def test_empty_trace(tmp_path, text):
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}:1: empty trace: no request lines"


@pytest.mark.skipif(not REAL_TRACE.exists(), reason="../shared/traces/ not present")
def test_real_trace_matches_readme():
    requests = load_trace(REAL_TRACE)
    stats = workload_stats(requests)
    # README: 12,031 requests over about 59 minutes; prompt mean 12,035, max 126,195; output mean 343;
    # about 37 % of prompt blocks repeat an earlier block.
    assert stats["num_requests"] == 12_031
    assert round(stats["prompt_tokens_mean"]) == 12_035
    assert stats["prompt_tokens_max"] == 126_195
    assert round(stats["output_tokens_mean"]) == 343
    assert 58 <= stats["duration_ms"] / 60_000 <= 60
    assert round(stats["repeated_block_share"], 2) == 0.37
    assert [r.req_id for r in requests] == list(range(12_031))
    assert np.all(np.diff([r.arrival_ms for r in requests]) >= 0)
    head = load_trace(REAL_TRACE, max_requests=10)
    assert head == requests[:10]


# ------------------------------------------------------------------------------------------- token ids

MASK64 = (1 << 64) - 1


def _splitmix64_oracle(x: int) -> int:
    """Plain-Python SplitMix64 output for state ``x`` (the published algorithm)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _tokens_oracle(hash_ids, input_length: int) -> list[int]:
    """Token by token: token j of block b is 1 + ((splitmix64(b) * (splitmix64(j) | 1)) mod 2**64 >> 34)."""
    tokens = []
    for position in range(input_length):
        block = hash_ids[position // 512]
        product = (_splitmix64_oracle(block) * (_splitmix64_oracle(position % 512) | 1)) & MASK64
        tokens.append(1 + (product >> 34))
    return tokens


def test_splitmix64_published_values():
    # The first outputs of SplitMix64 seeded with 0 (states 0, golden, 2*golden).
    states = np.array([0, 0x9E3779B97F4A7C15, (2 * 0x9E3779B97F4A7C15) & MASK64], dtype=np.uint64)
    assert splitmix64(states).tolist() == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def _request(hash_ids, input_length: int, req_id: int = 0) -> Request:
    return Request(
        req_id=req_id, arrival_ms=0.0, input_length=input_length, output_length=1, hash_ids=tuple(hash_ids)
    )


block_ids = st.integers(min_value=0, max_value=2**63 - 1)


@st.composite
def requests_st(draw):
    ids = draw(st.lists(block_ids, min_size=1, max_size=4, unique=True))
    last = draw(st.integers(min_value=1, max_value=512))
    return _request(ids, (len(ids) - 1) * 512 + last)


@settings(max_examples=40, deadline=None)
@given(requests_st())
def test_tokens_match_token_by_token_oracle(request):
    tokens = prompt_token_ids(request)
    assert tokens.dtype == np.int64
    assert tokens.shape == (request.input_length,)
    assert tokens.tolist() == _tokens_oracle(request.hash_ids, request.input_length)
    assert tokens.min() >= 1
    assert tokens.max() <= 2**30 <= VOCAB_SIZE - 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(block_ids, min_size=4, max_size=6, unique=True),
    st.integers(min_value=0, max_value=2),
    st.integers(min_value=1, max_value=512),
)
def test_equal_block_prefix_gives_equal_token_prefix(ids, shared, last):
    # a = ids[:3], b = ids[:shared] + ids[3:]: they share exactly `shared` leading blocks.
    a = _request(ids[:3], 2 * 512 + last)
    b_ids = ids[:shared] + ids[3:]
    b = _request(b_ids, (len(b_ids) - 1) * 512 + last)
    ta, tb = prompt_token_ids(a), prompt_token_ids(b)
    cut = shared * 512
    assert np.array_equal(ta[:cut], tb[:cut])
    # block `shared` differs in id, so its tokens differ (overwhelming probability)
    n = min(512, len(ta) - cut, len(tb) - cut)
    assert not np.array_equal(ta[cut : cut + n], tb[cut : cut + n])


@settings(max_examples=25, deadline=None)
@given(block_ids, st.lists(block_ids, min_size=0, max_size=3))
def test_block_tokens_do_not_depend_on_position(block, before):
    # Block `block` as the only block, and after other blocks: same 512 tokens; partial = prefix of full.
    alone = prompt_token_ids(_request([block], 512))
    later = prompt_token_ids(_request([*before, block], (len(before) + 1) * 512))
    assert np.array_equal(alone, later[len(before) * 512 :])
    partial = prompt_token_ids(_request([block], 100))
    assert np.array_equal(partial, alone[:100])


def test_block_size_parameter():
    # With block_size 4: blocks (7, 9), 6 tokens = 4 of block 7 then 2 of block 9.
    request = _request([7, 9], 6)
    tokens = prompt_token_ids(request, block_size=4)
    full7 = prompt_token_ids(_request([7], 512))
    full9 = prompt_token_ids(_request([9], 512))
    assert tokens.tolist() == full7[:4].tolist() + full9[:2].tolist()


def test_token_ids_reject_inconsistent_request():
    with pytest.raises(TraceError) as info:
        prompt_token_ids(_request([1, 2], 512, req_id=4))
    assert (
        str(info.value)
        == "request 4: hash_ids has 2 block ids but input_length 512 needs ceil(512 / 512) = 1"
    )
    with pytest.raises(TraceError) as info:
        prompt_token_ids(_request([1, -2], 600, req_id=5))
    assert str(info.value) == "request 5: hash_ids holds a negative block id -2"
    with pytest.raises(ConfigError, match="block_size must be >= 1, got 0"):
        prompt_token_ids(_request([1], 1), block_size=0)


def test_arrivals_are_rebased_to_the_first_timestamp_exactly(tmp_path):
    """Epoch-style integer timestamps: rebased exactly (1.7e18 as a float would have a spacing of 256 ms and
    quantise every TTFT); the same trace at offset 0 gives the same arrivals."""
    base = 1_700_000_000_000_000_000
    path = _write(tmp_path, [_line(timestamp=base), _line(timestamp=base + 12), _line(timestamp=base + 676)])
    assert [r.arrival_ms for r in load_trace(path)] == [0.0, 12.0, 676.0]
    floats = _write(tmp_path, [_line(timestamp=10.25), _line(timestamp=11.5)], name="floats.jsonl")
    assert [r.arrival_ms for r in load_trace(floats)] == [0.0, 1.25]


@pytest.mark.parametrize(
    ("stamps", "line", "what"),
    [
        ([1.7e18, 1.7e18], 1, "is 1.7e+18 ms, a float too large for float64 to hold to 0.0009765625 ms"),
        ([1e308], 1, "is 1e+308 ms, a float too large for float64"),
        (
            [5, 2**44],
            2,
            "is 17592186044416 ms, 17592186044411 ms after the first line's: beyond 8796093022208 ms",
        ),
    ],
    ids=["float-epoch", "float-huge", "span"],
)
def test_timestamps_float64_cannot_space_are_rejected(tmp_path, stamps, line, what):
    path = _write(tmp_path, [_line(timestamp=t) for t in stamps])
    with pytest.raises(
        TraceError, match=rf"^{re.escape(str(path))}:{line}: field 'timestamp' {re.escape(what)}"
    ):
        load_trace(path)
