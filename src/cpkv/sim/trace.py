"""Mooncake-format traces: the ``Request`` record, the validating JSONL loader, token ids from block ids.

Prompts are described, as in the Mooncake trace, by the ids of their consecutive 512-token blocks
(``hash_ids``; the last block may be partial): two requests whose ``hash_ids`` share a leading run share
that many blocks of identical prompt prefix. ``prompt_token_ids`` turns the block ids into token ids,
deterministically and from the block id only, so a prefix cache keyed by token ids sees exactly the reuse
the trace describes. ``load_trace`` reads ``../shared/traces/mooncake_conversation_trace.jsonl`` (or any
file of that format), every field of every line validated before anything is returned.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from typing import Annotated, overload

import msgspec
import numpy as np

from .. import limits
from ..config import check_int
from ..errors import CpkvError
from ..validate import duplicate_key

TRACE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in Mooncake traces (the last block of a prompt may be partial)."""

VOCAB_SIZE = 2**31 - 1
"""Derived token ids lie in ``[1, VOCAB_SIZE - 1]``; 0 is never used (free for padding)."""

_INT64_MAX = 2**63 - 1
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_TIMESTAMP_MS = float(2**43)
"""Largest arrival (ms after the first line) and largest float timestamp a trace may hold: below 2**43 ms
(about 279 years) float64 resolves ``TIMESTAMP_RESOLUTION_MS``, so simulated step times are not rounded."""
TIMESTAMP_RESOLUTION_MS = 2.0**-10


class TraceError(CpkvError, ValueError):
    """A malformed trace or request (SPEC C-FAIL-FAST).

    From ``load_trace`` the message is ``"{path}:{lineno}: {what}"`` (1-based line number; a file that
    cannot be read gives ``"{path}: cannot read trace: {reason}"``); from ``prompt_token_ids`` it is
    ``"request {req_id}: {what}"``. ``what`` names the field and the offending value.
    """


class Request(msgspec.Struct, frozen=True):
    """One request of a workload, immutable.

    Attributes:
        req_id: 0-based position in the workload (for a trace: the order of its lines).
        arrival_ms: arrival time, ms from the start of the workload, float >= 0; non-decreasing in
            ``req_id`` order.
        input_length: prompt tokens, int >= 1.
        output_length: tokens to generate, int >= 0.
        hash_ids: ids (ints in ``[0, 2**63)``) of the prompt's consecutive ``TRACE_BLOCK_TOKENS``-token
            blocks; ``len(hash_ids) == ceil(input_length / 512)``. Equal ids mean equal block contents.
    """

    req_id: int
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


# ----------------------------------------------------------------------------------------------- trace


class _TraceLine(msgspec.Struct):
    """One JSONL line as the typed decoder checks it (fast path); extra fields are ignored."""

    timestamp: Annotated[int, msgspec.Meta(ge=0)] | Annotated[float, msgspec.Meta(ge=0)]  # ints stay exact
    input_length: Annotated[int, msgspec.Meta(ge=1, le=_INT64_MAX)]
    output_length: Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
    hash_ids: tuple[Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)], ...]


_LINE_DECODER = msgspec.json.Decoder(_TraceLine)
_ANY_DECODER = msgspec.json.Decoder()


def load_trace(path: str | os.PathLike[str], max_requests: int | None = None) -> list[Request]:
    """Load a Mooncake JSONL trace, validating every field of every line read before returning.

    Each line is one JSON object with ``timestamp`` (ms, int or float, >= 0, non-decreasing; arrivals are
    rebased to the first line's timestamp, exactly for integers, so a trace may carry epoch times),
    ``input_length`` (int >= 1), ``output_length`` (int >= 0) and ``hash_ids`` (list of ints in
    ``[0, 2**63)``, exactly ``ceil(input_length / 512)`` of them; the real conversation trace satisfies
    this on all 12,031 lines). JSON booleans are not integers; integral floats such as ``512.0`` are not
    integers either. Fields other than these four are ignored; a key written twice in a line is refused. Blank (whitespace-only) lines are allowed
    only after the last request line; a blank line between requests is an error.

    Args:
        path: the JSONL file.
        max_requests: read only the first ``max_requests`` request lines (int >= 1); lines after them
            are neither decoded nor validated. ``None`` reads the whole file.

    Returns:
        ``Request`` records, ``req_id`` = 0-based line order, ``arrival_ms = timestamp - first timestamp``
        (float64 ms).

    Raises:
        TraceError: the file cannot be read, holds no request line, or a line is malformed, repeats a key, or would need
            more than ``cpkv.limits.MAX_ARRAY_BYTES`` (8 B per prompt token twice, per output token once), or
            a timestamp float64 cannot hold to ``TIMESTAMP_RESOLUTION_MS`` (a float at or above
            ``MAX_TIMESTAMP_MS``, or a rebased arrival there: step times would be rounded away); the message is ``"{path}:{lineno}: {what}"`` naming the field and value. Nothing is returned.
        ConfigError: ``max_requests`` is not an int >= 1.
    """
    return list(iter_trace(path, max_requests))


def iter_trace(path: str | os.PathLike[str], max_requests: int | None = None) -> Iterator[Request]:
    """The requests of a Mooncake JSONL trace, read and validated one line at a time (``load_trace``'s rules,
    messages and ``Request`` records, in order), so a trace of any length takes the memory of one line.

    The file is opened on the first ``next``; a malformed line raises ``TraceError`` when it is reached, after
    the requests before it were yielded (``load_trace`` and ``TraceStream`` read the whole file first).
    A blank line is looked past: the lines after it are read until one holds a request (the error) or the
    file ends (the end of the trace).

    Raises:
        TraceError, ConfigError: as ``load_trace``.
    """
    if max_requests is not None:
        max_requests = check_int("max_requests", max_requests, 1)
    return _lines(path, max_requests)


def _lines(path: str | os.PathLike[str], max_requests: int | None) -> Iterator[Request]:
    name = os.fspath(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below, also when the generator is dropped)
    except OSError as exc:
        raise TraceError(f"{name}: cannot read trace: {exc.strerror or exc}") from exc
    with f:
        previous_ms: float = 0
        first_ms: float = 0
        index = 0
        blank = -1  # index of the first blank line of a run of blank lines, -1 in none
        for raw in _read(f, name):
            if blank < 0 and max_requests is not None and index >= max_requests:
                return
            if not raw.strip():
                blank = index if blank < 0 else blank
                index += 1
                continue
            if blank >= 0:  # a blank line between requests (perhaps past max_requests: as load_trace)
                raise TraceError(
                    f"{name}:{blank + 1}: blank line (blank lines are allowed only after the last request)"
                )
            where = f"{name}:{index + 1}"
            try:
                line = _LINE_DECODER.decode(raw)
            except msgspec.MsgspecError as exc:
                raise TraceError(_diagnose(raw, where, exc)) from None
            if raw.count(b'"') != 8:  # 8 quotes: 4 strings, the 4 keys (distinct); else a key may be twice
                key = duplicate_key(raw)
                if key is not None:
                    raise TraceError(
                        f"{where}: key {key!r} appears twice in one object (refused: JSON readers keep the last "
                        f"value without a word)"
                    )
            if index == 0:
                previous_ms = first_ms = line.timestamp
            if isinstance(line.timestamp, float) and line.timestamp >= MAX_TIMESTAMP_MS:
                raise TraceError(
                    f"{where}: field 'timestamp' is {line.timestamp!r} ms, a float too large for float64 to hold to "
                    f"{TIMESTAMP_RESOLUTION_MS} ms (at most {MAX_TIMESTAMP_MS:.0f}): write integer milliseconds, or "
                    f"times relative to the trace's start"
                )
            if line.timestamp < previous_ms:
                raise TraceError(
                    f"{where}: field 'timestamp' is {line.timestamp!r} ms, before the previous line's "
                    f"{previous_ms!r} ms (timestamps must be non-decreasing)"
                )
            needed = -(-line.input_length // TRACE_BLOCK_TOKENS)
            if len(line.hash_ids) != needed:
                raise TraceError(
                    f"{where}: field 'hash_ids' has {len(line.hash_ids)} block ids but input_length "
                    f"{line.input_length} needs ceil({line.input_length} / {TRACE_BLOCK_TOKENS}) = {needed}"
                )
            nbytes = 8 * (2 * line.input_length + line.output_length)  # token ids and the request's slot row
            if nbytes > limits.MAX_ARRAY_BYTES:
                raise TraceError(
                    f"{where}: input_length {line.input_length} + output_length {line.output_length} would need "
                    f"{nbytes:,} bytes of arrays for this request, above cpkv's limit of {limits.MAX_ARRAY_BYTES:,} bytes "
                    f"(cpkv.limits.MAX_ARRAY_BYTES)"
                )
            previous_ms = line.timestamp
            arrival_ms = (
                line.timestamp - first_ms if first_ms else line.timestamp
            )  # exact for ints (Python ints)
            if arrival_ms >= MAX_TIMESTAMP_MS:
                raise TraceError(
                    f"{where}: field 'timestamp' is {line.timestamp!r} ms, {arrival_ms!r} ms after the first line's: "
                    f"beyond {MAX_TIMESTAMP_MS:.0f} ms float64 cannot hold times to {TIMESTAMP_RESOLUTION_MS} ms"
                )
            yield Request(index, float(arrival_ms), line.input_length, line.output_length, line.hash_ids)
            index += 1
        if index == 0 or blank == 0:
            raise TraceError(f"{name}:1: empty trace: no request lines")


def _read(f, name: str) -> Iterator[bytes]:
    """The lines of ``f`` without their ``\\n`` (the text after the last newline is a line too)."""
    try:
        for raw in f:
            yield raw[:-1] if raw.endswith(b"\n") else raw
    except OSError as exc:
        raise TraceError(f"{name}: cannot read trace: {exc.strerror or exc}") from exc


class TraceStream:
    """A Mooncake JSONL trace as a stream of ``Request`` records: every iteration re-opens the file and reads it
    one line at a time (``iter_trace``), so a replay holds the requests in flight, never the whole trace.

    Building it reads the file once, validating every line (``load_trace``'s rules and messages) and counting the
    requests, so a malformed trace fails before any replay. ``len`` is that count; indexing and slicing read the
    file again (a slice or a negative index holds its requests: for short traces and tests, not the replay).
    The file must not change while the stream is in use. Example: ``len(TraceStream(path, max_requests=200))``
    is 200 for the Mooncake conversation trace, and ``list(stream) == load_trace(path, 200)``.

    Raises:
        TraceError, ConfigError: as ``load_trace`` (when built; a file changed since raises them later).
    """

    def __init__(self, path: str | os.PathLike[str], max_requests: int | None = None) -> None:
        self.path, self.max_requests = path, max_requests
        self._count = sum(1 for _ in iter_trace(path, max_requests))

    def __iter__(self) -> Iterator[Request]:
        return iter_trace(self.path, self.max_requests)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, key: int) -> Request: ...
    @overload
    def __getitem__(self, key: slice) -> tuple[Request, ...]: ...
    def __getitem__(self, key: int | slice) -> Request | tuple[Request, ...]:
        if isinstance(key, slice) or key < 0:
            return tuple(self)[key]
        if key >= self._count:
            raise IndexError(f"request {key} of a trace of {self._count} requests")
        return next(itertools.islice(self, key, None))

    def __repr__(self) -> str:
        return f"TraceStream({os.fspath(self.path)!r}, max_requests={self.max_requests!r}): {self._count} requests"


def _diagnose(raw: bytes, where: str, exc: Exception) -> str:
    """Message for a line the typed decoder rejected: the first bad field, its value, the rule."""
    if not raw.strip():
        return f"{where}: blank line (blank lines are allowed only after the last request)"
    try:
        obj = _ANY_DECODER.decode(raw)
    except msgspec.MsgspecError:
        snippet = raw[:80].decode("utf-8", errors="replace")
        return f"{where}: invalid JSON: {snippet!r}"
    if not isinstance(obj, dict):
        return f"{where}: expected a JSON object, got {_describe(obj)}"
    for field in _FIELDS:
        if field not in obj:
            return f"{where}: missing field {field!r}"
    problem = (
        _check_number("timestamp", obj["timestamp"], integer=False, minimum=0)
        or _check_number("input_length", obj["input_length"], integer=True, minimum=1)
        or _check_number("output_length", obj["output_length"], integer=True, minimum=0)
        or _check_hash_ids(obj["hash_ids"])
    )
    return f"{where}: {problem or exc}"


def _check_hash_ids(value: object) -> str | None:
    if not isinstance(value, list):
        return f"field 'hash_ids' must be a list of integers, got {_describe(value)}"
    for i, block in enumerate(value):
        problem = _check_number(f"hash_ids[{i}]", block, integer=True, minimum=0)
        if problem:
            return problem
    return None


def _check_number(field: str, value: object, *, integer: bool, minimum: int) -> str | None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = "an integer" if integer else "a number"
        return f"field {field!r} must be {wanted}, got {_describe(value)}"
    if value < minimum:
        return f"field {field!r} must be >= {minimum}, got {_describe(value)}"
    if value > _INT64_MAX or not math.isfinite(value):
        return f"field {field!r} must be < 2**63, got {_describe(value)}"
    return None


def _describe(value: object) -> str:
    """JSON type and JSON text of a decoded value, e.g. ``boolean true``, ``string "12"``."""
    if value is None:
        return "null"
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "object"}
    text = msgspec.json.encode(value).decode()
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind[type(value)]} {text}"


# ------------------------------------------------------------------------------------------ token ids

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31, _S34, _ONE = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(34), np.uint64(1)
_MULTIPLIERS: dict[
    int, np.ndarray
] = {}  # block_size -> uint64 [block_size]: splitmix64(j) | 1, the odd multiplier of position j


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 output for states ``x`` (uint64 array, any shape), elementwise, wrapping mod 2**64.

    ``splitmix64([0]) == [0xE220A8397B1DCDAF]`` (the first output of the generator seeded with 0).
    """
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        t = np.empty_like(z)
        for shift, mul in ((_S30, _MIX1), (_S27, _MIX2)):
            np.right_shift(z, shift, out=t)
            z ^= t
            z *= mul
        np.right_shift(z, _S31, out=t)
        z ^= t
    return z


def prompt_token_ids(request: Request, block_size: int = TRACE_BLOCK_TOKENS) -> np.ndarray:
    """Token ids of a request's prompt, derived from its block ids; int64 ``[input_length]``.

    Token ``j`` (0-based) of block ``b`` is ``1 + ((splitmix64(b) * (splitmix64(j) | 1)) mod 2**64 >> 34)``:
    a function of ``(b, j)`` only, in ``[1, 2**30]`` (inside ``[1, VOCAB_SIZE - 1]``). Equal block ids
    give equal tokens wherever they appear, so equal ``hash_ids`` prefixes give equal token prefixes.
    Different ids give different tokens at a position with probability about ``1 - 2**-30`` each (the top
    30 bits of a 64-bit product by a position's own odd multiplier), so two distinct blocks agree on a
    whole page of P tokens with probability about ``2**(-30 P)``. The last, partial block is a prefix of
    its full block. Three passes over the tokens (multiply, shift, add), written in the result's memory.
    Example: ``hash_ids=(7, 9), input_length=600`` gives the 512 tokens of block 7, then the first 88
    tokens of block 9.

    Raises:
        TraceError: ``len(hash_ids) != ceil(input_length / block_size)`` or a negative block id.
        ConfigError: ``block_size`` is not an int >= 1.
    """
    block_size = check_int("block_size", block_size, 1)
    needed = -(-request.input_length // block_size)
    if len(request.hash_ids) != needed:
        raise TraceError(
            f"request {request.req_id}: hash_ids has {len(request.hash_ids)} block ids but input_length "
            f"{request.input_length} needs ceil({request.input_length} / {block_size}) = {needed}"
        )
    blocks = np.asarray(request.hash_ids, dtype=np.int64)  # [num_blocks]
    if blocks.size and blocks.min() < 0:
        raise TraceError(f"request {request.req_id}: hash_ids holds a negative block id {int(blocks.min())}")
    multipliers = _MULTIPLIERS.get(block_size)
    if multipliers is None:
        multipliers = _MULTIPLIERS[block_size] = splitmix64(np.arange(block_size, dtype=np.uint64)) | _ONE
    n, full = request.input_length, request.input_length // block_size
    out = np.empty(n, dtype=np.int64)
    z = out.view(np.uint64)
    keys = splitmix64(blocks.astype(np.uint64))  # [num_blocks]
    with np.errstate(over="ignore"):  # products wrap mod 2**64
        np.multiply(keys[:full, None], multipliers, out=z[: full * block_size].reshape(full, block_size))
        np.multiply(keys[full:], multipliers[: n - full * block_size], out=z[full * block_size :])
    np.right_shift(z, _S34, out=z)
    z += _ONE
    return out  # every value is at most 2**30: its int64 reading is the same number
