"""Simulator workloads: the Mooncake trace loader, seeded synthetic workloads, token ids from block ids.

A workload is a list of ``Request`` records in arrival order. Prompts are described, as in the Mooncake
trace, by the ids of their consecutive 512-token blocks (``hash_ids``; the last block may be partial):
two requests whose ``hash_ids`` share a leading run share that many blocks of identical prompt prefix.
``prompt_token_ids`` turns the block ids into token ids, deterministically and from the block id only,
so a prefix cache keyed by token ids sees exactly the reuse the trace describes.

Workloads:
- ``load_trace``: a Mooncake JSONL trace (``../shared/traces/mooncake_conversation_trace.jsonl``), every
  field of every line validated before anything is returned.
- ``synthetic_workload``: long-tailed prompt and output lengths, Poisson arrivals, shared prefixes.
- ``tiny_chunks_workload``: the production pattern behind the lane-starvation livelock (SPEC section 1,
  C-PHASE, C-ROTATION-SPREADS): a burst of concurrent requests prefilled in one-page chunks.
- ``build_workload``: one of the three by name, with the chunk size the simulator should use.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec
import numpy as np

from .. import limits
from ..config import check_int
from ..errors import ConfigError, CpkvError

TRACE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in Mooncake traces (the last block of a prompt may be partial)."""

VOCAB_SIZE = 2**31 - 1
"""Derived token ids lie in ``[1, VOCAB_SIZE - 1]``; 0 is never used (free for padding)."""

TINY_CHUNKS_CHUNK_PAGES = 1
"""Prefill chunk size, in pages, that the tiny-chunks workload is meant to run with (one page a chunk)."""

WORKLOAD_NAMES = ("synthetic", "tiny-chunks", "trace")
"""Names accepted by ``build_workload``."""

_INT64_MAX = 2**63 - 1
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


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

    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    input_length: Annotated[int, msgspec.Meta(ge=1, le=_INT64_MAX)]
    output_length: Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
    hash_ids: tuple[Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)], ...]


_LINE_DECODER = msgspec.json.Decoder(_TraceLine)
_ANY_DECODER = msgspec.json.Decoder()


def load_trace(path: str | os.PathLike[str], max_requests: int | None = None) -> list[Request]:
    """Load a Mooncake JSONL trace, validating every field of every line read before returning.

    Each line is one JSON object with ``timestamp`` (ms, int or float, >= 0, non-decreasing),
    ``input_length`` (int >= 1), ``output_length`` (int >= 0) and ``hash_ids`` (list of ints in
    ``[0, 2**63)``, exactly ``ceil(input_length / 512)`` of them; the real conversation trace satisfies
    this on all 12,031 lines). JSON booleans are not integers; integral floats such as ``512.0`` are not
    integers either. Fields other than these four are ignored. Blank (whitespace-only) lines are allowed
    only after the last request line; a blank line between requests is an error.

    Args:
        path: the JSONL file.
        max_requests: read only the first ``max_requests`` request lines (int >= 1); lines after them
            are neither decoded nor validated. ``None`` reads the whole file.

    Returns:
        ``Request`` records, ``req_id`` = 0-based line order, ``arrival_ms = float(timestamp)``.

    Raises:
        TraceError: the file cannot be read, holds no request line, or a line is malformed or would need
            more than ``cpkv.limits.MAX_ARRAY_BYTES`` (8 B per prompt token twice, per output token once);
            the message is ``"{path}:{lineno}: {what}"`` naming the field and value. Nothing is returned.
        ConfigError: ``max_requests`` is not an int >= 1.
    """
    if max_requests is not None:
        max_requests = check_int("max_requests", max_requests, 1)
    name = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(f"{name}: cannot read trace: {exc.strerror or exc}") from exc
    lines = data.split(b"\n")
    end = len(lines)
    while end and not lines[end - 1].strip():  # trailing blank lines are skipped
        end -= 1
    if end == 0:
        raise TraceError(f"{name}:1: empty trace: no request lines")
    if max_requests is not None:
        end = min(end, max_requests)
    requests: list[Request] = []
    previous_ms = 0.0
    for index in range(end):
        where = f"{name}:{index + 1}"
        raw = lines[index]
        try:
            line = _LINE_DECODER.decode(raw)
        except msgspec.MsgspecError as exc:
            raise TraceError(_diagnose(raw, where, exc)) from None
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
        requests.append(Request(index, line.timestamp, line.input_length, line.output_length, line.hash_ids))
    return requests


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


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 output for states ``x`` (uint64 array, any shape), elementwise, wrapping mod 2**64.

    ``splitmix64([0]) == [0xE220A8397B1DCDAF]`` (the first output of the generator seeded with 0).
    """
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def prompt_token_ids(request: Request, block_size: int = TRACE_BLOCK_TOKENS) -> np.ndarray:
    """Token ids of a request's prompt, derived from its block ids; int64 ``[input_length]``.

    Token ``j`` (0-based) of block ``b`` is ``1 + splitmix64((splitmix64(b) + j) mod 2**64) % (VOCAB_SIZE
    - 1)``: a function of ``(b, j)`` only, in ``[1, VOCAB_SIZE - 1]``. Equal block ids give equal tokens
    wherever they appear, so equal ``hash_ids`` prefixes give equal token prefixes; different ids give
    different blocks with overwhelming probability. The last, partial block is a prefix of its full
    block. Example: ``hash_ids=(7, 9), input_length=600`` gives the 512 tokens of block 7, then the first
    88 tokens of block 9.

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
    offsets = np.arange(block_size, dtype=np.uint64)  # [block_size]
    with np.errstate(over="ignore"):
        keys = splitmix64(blocks.astype(np.uint64))[:, None] + offsets[None, :]  # [num_blocks, block_size]
    tokens = splitmix64(keys.reshape(-1)[: request.input_length]) % np.uint64(VOCAB_SIZE - 1) + np.uint64(1)
    return tokens.astype(np.int64)


# ---------------------------------------------------------------------------------------- generators

_PROMPT_SIGMA = 1.0  # log-normal shape of prompt lengths
_OUTPUT_SIGMA = 1.0  # log-normal shape of output lengths
_MAX_OUTPUT_TOKENS = 8192
_PREFIX_SIGMA = 0.5  # log-normal shape of shared-prefix lengths (blocks)
_MAX_PREFIX_BLOCKS = 128
_ZIPF_EXPONENT = 0.7  # popularity of shared prefix k is proportional to (k + 1) ** -0.7


def synthetic_workload(
    num_requests: int = 1000,
    seed: int = 0,
    *,
    rate_per_s: float = 4.0,
    mean_prompt_tokens: float = 11_000.0,
    min_prompt_tokens: int = 256,
    max_prompt_tokens: int = 131_072,
    mean_output_tokens: float = 350.0,
    num_shared_prefixes: int = 64,
    shared_prefix_prob: float = 0.8,
    mean_shared_prefix_blocks: float = 16.0,
) -> list[Request]:
    """A seeded synthetic workload shaped like the Mooncake conversation trace.

    Prompt lengths (tokens) are log-normal with mean ``mean_prompt_tokens`` (sigma 1), rounded and
    clipped to ``[min_prompt_tokens, max_prompt_tokens]``; output lengths log-normal with mean
    ``mean_output_tokens``, clipped to ``[1, 8192]``. Arrivals are Poisson at ``rate_per_s`` requests per
    second, the first at 0 ms. A pool of ``num_shared_prefixes`` shared block runs ("system prompts",
    documents; log-normal lengths, mean ``mean_shared_prefix_blocks`` blocks, clipped to [1, 128]) has
    Zipf popularity (prefix k drawn with weight ``(k + 1) ** -0.7``); with
    probability ``shared_prefix_prob`` a request starts with one of them (as many of its blocks as fit in
    the request's full blocks), the rest of its blocks are fresh ids. With the defaults 30-40 % of all
    blocks repeat an earlier block (seeds 0..11: mean 34 %; the real trace: 37 %). The same arguments
    always give the same list.

    Returns:
        ``num_requests`` ``Request`` records in arrival order, block size ``TRACE_BLOCK_TOKENS``.

    Raises:
        ConfigError: a count or length that is not an int in range, a rate or mean that is not a
            positive finite number, a probability outside ``[0, 1]``, or ``min_prompt_tokens >
            max_prompt_tokens``.
    """
    num_requests = check_int("num_requests", num_requests, 1)
    seed = check_int("seed", seed, 0)
    min_prompt_tokens = check_int("min_prompt_tokens", min_prompt_tokens, 1)
    max_prompt_tokens = check_int("max_prompt_tokens", max_prompt_tokens, min_prompt_tokens)
    num_shared_prefixes = check_int("num_shared_prefixes", num_shared_prefixes, 1)
    rate_per_s = _check_positive("rate_per_s", rate_per_s)
    mean_prompt_tokens = _check_positive("mean_prompt_tokens", mean_prompt_tokens)
    mean_output_tokens = _check_positive("mean_output_tokens", mean_output_tokens)
    mean_shared_prefix_blocks = _check_positive("mean_shared_prefix_blocks", mean_shared_prefix_blocks)
    shared_prefix_prob = _check_probability("shared_prefix_prob", shared_prefix_prob)

    rng = np.random.default_rng(seed)
    prompt = _lognormal_ints(rng, mean_prompt_tokens, _PROMPT_SIGMA, num_requests)
    prompt = np.clip(prompt, min_prompt_tokens, max_prompt_tokens)
    output = np.clip(
        _lognormal_ints(rng, mean_output_tokens, _OUTPUT_SIGMA, num_requests), 1, _MAX_OUTPUT_TOKENS
    )
    gaps_ms = rng.exponential(1000.0 / rate_per_s, num_requests)
    gaps_ms[0] = 0.0
    arrival_ms = np.cumsum(gaps_ms)
    # The shared pool: prefix k is the id run pool_start[k] .. pool_start[k] + pool_blocks[k] - 1.
    pool_blocks = np.clip(
        _lognormal_ints(rng, mean_shared_prefix_blocks, _PREFIX_SIGMA, num_shared_prefixes),
        1,
        _MAX_PREFIX_BLOCKS,
    )
    pool_start = np.concatenate(([0], np.cumsum(pool_blocks)[:-1]))
    popularity = 1.0 / np.arange(1, num_shared_prefixes + 1) ** _ZIPF_EXPONENT
    choice = rng.choice(num_shared_prefixes, size=num_requests, p=popularity / popularity.sum())
    uses_prefix = rng.random(num_requests) < shared_prefix_prob
    next_id = int(pool_blocks.sum())
    requests = []
    for i in range(num_requests):
        length = int(prompt[i])
        num_blocks = -(-length // TRACE_BLOCK_TOKENS)
        shared = min(int(pool_blocks[choice[i]]), length // TRACE_BLOCK_TOKENS) if uses_prefix[i] else 0
        start = int(pool_start[choice[i]])
        fresh = num_blocks - shared
        hash_ids = tuple(range(start, start + shared)) + tuple(range(next_id, next_id + fresh))
        next_id += fresh
        requests.append(Request(i, float(arrival_ms[i]), length, int(output[i]), hash_ids))
    return requests


def tiny_chunks_workload(
    num_requests: int = 64,
    seed: int = 0,
    *,
    min_prompt_tokens: int = 2048,
    max_prompt_tokens: int = 8192,
    max_output_tokens: int = 256,
) -> list[Request]:
    """The lane-starvation pattern (SPEC section 1): a burst of concurrent requests, one-page chunks.

    All ``num_requests`` requests arrive at 0 ms with prompt lengths uniform in ``[min_prompt_tokens,
    max_prompt_tokens]`` tokens, output lengths uniform in ``[1, max_output_tokens]``, and no shared
    blocks (every page is new). Run it with a prefill chunk of ``TINY_CHUNKS_CHUNK_PAGES`` (= 1) page, as
    ``build_workload("tiny-chunks")`` records: every chunk then needs one new page, which the ``legacy``
    policy (phase 0) puts on lane 0 for every chunk of every request, so at cp_size 8 lane 0 fills while
    lanes 1..7 stay empty; ``rotation`` spreads the pages evenly (C-ROTATION-SPREADS).

    Returns:
        ``num_requests`` ``Request`` records, ``arrival_ms == 0.0``, block size ``TRACE_BLOCK_TOKENS``.

    Raises:
        ConfigError: a count or length that is not an int in range, or ``min_prompt_tokens >
            max_prompt_tokens``.
    """
    num_requests = check_int("num_requests", num_requests, 1)
    seed = check_int("seed", seed, 0)
    min_prompt_tokens = check_int("min_prompt_tokens", min_prompt_tokens, 1)
    max_prompt_tokens = check_int("max_prompt_tokens", max_prompt_tokens, min_prompt_tokens)
    max_output_tokens = check_int("max_output_tokens", max_output_tokens, 1)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(min_prompt_tokens, max_prompt_tokens, size=num_requests, endpoint=True)
    output = rng.integers(1, max_output_tokens, size=num_requests, endpoint=True)
    requests = []
    next_id = 0
    for i in range(num_requests):
        num_blocks = -(-int(prompt[i]) // TRACE_BLOCK_TOKENS)
        hash_ids = tuple(range(next_id, next_id + num_blocks))
        next_id += num_blocks
        requests.append(Request(i, 0.0, int(prompt[i]), int(output[i]), hash_ids))
    return requests


def _lognormal_ints(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    """``size`` log-normal draws with the given mean (not median), rounded to int64."""
    mu = math.log(mean) - sigma * sigma / 2.0
    return np.rint(rng.lognormal(mu, sigma, size)).astype(np.int64)


def _check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _check_probability(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name} must be a number in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------------ named workloads


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """A named workload and the simulator setting it is meant to run with.

    Attributes:
        name: one of ``WORKLOAD_NAMES``.
        requests: the requests in arrival order.
        chunk_pages: prefill chunk size in pages (chunk tokens = ``chunk_pages * page_size``), int >= 1,
            or ``None`` for the simulator's own default.
        description: one line for report headers.
    """

    name: str
    requests: tuple[Request, ...]
    chunk_pages: int | None
    description: str

    def __post_init__(self) -> None:
        if self.name not in WORKLOAD_NAMES:
            raise ConfigError(f"workload {self.name!r} is unknown; use one of {', '.join(WORKLOAD_NAMES)}")
        if self.chunk_pages is not None:
            object.__setattr__(self, "chunk_pages", check_int("chunk_pages", self.chunk_pages, 1))
        object.__setattr__(self, "requests", tuple(self.requests))


def build_workload(
    name: str,
    *,
    num_requests: int | None = None,
    seed: int = 0,
    trace_path: str | os.PathLike[str] | None = None,
) -> WorkloadSpec:
    """Build the workload ``name`` (``"synthetic"``, ``"tiny-chunks"`` or ``"trace"``).

    ``num_requests`` overrides the generator's default count, or for ``"trace"`` caps the lines read
    (``max_requests``); ``seed`` seeds the generators (unused by ``"trace"``); ``trace_path`` is required
    for ``"trace"`` and rejected otherwise. ``"tiny-chunks"`` carries ``chunk_pages =
    TINY_CHUNKS_CHUNK_PAGES``; the others ``None``.

    Raises:
        ConfigError: unknown name, ``trace_path`` missing for ``"trace"`` or given for a generator, or a
            bad count or seed.
        TraceError: the trace cannot be read or is malformed (see ``load_trace``).
    """
    if name not in WORKLOAD_NAMES:
        raise ConfigError(f"workload {name!r} is unknown; use one of {', '.join(WORKLOAD_NAMES)}")
    if (name == "trace") != (trace_path is not None):
        raise ConfigError(
            f"trace_path is required for workload 'trace' and only for it; got {name!r}, "
            f"trace_path={trace_path!r}"
        )
    count = {} if num_requests is None else {"num_requests": num_requests}
    if name == "trace":
        requests = load_trace(trace_path, max_requests=num_requests)  # type: ignore[arg-type]
        return WorkloadSpec(
            name=name,
            requests=tuple(requests),
            chunk_pages=None,
            description=f"Mooncake trace {os.fspath(trace_path)}",
        )  # type: ignore[arg-type]
    if name == "synthetic":
        requests = synthetic_workload(seed=seed, **count)
        return WorkloadSpec(
            name=name,
            requests=tuple(requests),
            chunk_pages=None,
            description=f"synthetic, seed {seed}: log-normal prompts, Poisson arrivals, shared prefixes",
        )
    requests = tiny_chunks_workload(seed=seed, **count)
    return WorkloadSpec(
        name=name,
        requests=tuple(requests),
        chunk_pages=TINY_CHUNKS_CHUNK_PAGES,
        description=f"tiny chunks, seed {seed}: concurrent burst prefilled one page a chunk",
    )


# --------------------------------------------------------------------------------------------- stats


def workload_stats(requests: Sequence[Request]) -> dict[str, int | float]:
    """Summary of a workload for report headers.

    Returns a dict: ``num_requests``; ``prompt_tokens_total``, ``prompt_tokens_max`` (ints, tokens);
    ``prompt_tokens_mean``, ``output_tokens_mean`` (floats, tokens); ``duration_ms`` (last minus first
    arrival, float ms); ``repeated_block_share`` (float in [0, 1]: block occurrences whose id occurred
    earlier, over all block occurrences). An empty workload gives zeros.
    """
    n = len(requests)
    if n == 0:
        return {
            "num_requests": 0,
            "prompt_tokens_total": 0,
            "prompt_tokens_mean": 0.0,
            "prompt_tokens_max": 0,
            "output_tokens_mean": 0.0,
            "duration_ms": 0.0,
            "repeated_block_share": 0.0,
        }
    prompt = np.fromiter((r.input_length for r in requests), dtype=np.int64, count=n)  # [n]
    output = np.fromiter((r.output_length for r in requests), dtype=np.int64, count=n)  # [n]
    arrival = np.fromiter((r.arrival_ms for r in requests), dtype=np.float64, count=n)  # [n]
    blocks = np.fromiter(itertools.chain.from_iterable(r.hash_ids for r in requests), dtype=np.int64)
    repeated = blocks.size - np.unique(blocks).size
    return {
        "num_requests": n,
        "prompt_tokens_total": int(prompt.sum()),
        "prompt_tokens_mean": float(prompt.mean()),
        "prompt_tokens_max": int(prompt.max()),
        "output_tokens_mean": float(output.mean()),
        "duration_ms": float(arrival.max() - arrival.min()),
        "repeated_block_share": repeated / blocks.size if blocks.size else 0.0,
    }

