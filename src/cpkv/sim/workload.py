"""Simulator workloads: seeded synthetic workloads and the named workloads ``cpkv simulate`` runs.

A workload is a list of ``Request`` records (``trace.py``) in arrival order; prompts are described by
the ids of their 512-token blocks, so shared leading ids mean a shared prompt prefix.

Workloads:
- ``trace``: a Mooncake JSONL trace, streamed (``trace.TraceStream``).
- ``synthetic_workload``: long-tailed prompt and output lengths, Poisson arrivals, shared prefixes.
- ``tiny_chunks_workload``: the production pattern behind the lane-starvation livelock (SPEC section 1,
  C-PHASE, C-ROTATION-SPREADS): a burst of concurrent requests prefilled in one-page chunks.
- ``short_prompts_workload``: prompts of one or two pages arriving one at a time (C-PHASE's case for
  ``balanced``: rotation gives every such request phase 0).
- ``tiny_chunks_reload_workload``: the whole seed incident: tiny-chunk conversations whose follow-up
  turns come back after their prefixes went to the host tier, so load-back must land on recorded lanes.
- ``build_workload``: one of them by name, with the chunk size and pool the simulator should use.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..config import DEFAULT_PAGE_SIZE, check_int
from ..errors import ConfigError
from ..limits import check_bytes
from .scenarios import (
    TINY_CHUNKS_CHUNK_PAGES,
    short_prompts_workload,
    tiny_chunks_reload_workload,
    tiny_chunks_workload,
)
from .trace import TRACE_BLOCK_TOKENS, Request, TraceStream

WORKLOAD_NAMES = ("synthetic", "tiny-chunks", "tiny-chunks-reload", "short-prompts", "trace")
"""Names accepted by ``build_workload``."""

REQUEST_BYTES = 200
"""Fewest bytes one generated request keeps (its ``Request`` record; measured with tracemalloc at 3000
requests: short-prompts about 210, synthetic about 1260), so ``build_workload`` refuses a count whose
requests could not fit ``cpkv.limits.MAX_ARRAY_BYTES`` before generating any."""
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
    seed = check_int("seed", seed, 0, None)
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
        requests: the requests in arrival order: a tuple, or for a trace a ``TraceStream`` (read from the file
            at each pass, so a day-scale trace is never held).
        chunk_pages: prefill chunk size in pages (chunk tokens = ``chunk_pages * page_size``), int >= 1,
            or ``None`` for the simulator's own default.
        description: one line for report headers.
        pool_percent: device pool, all lanes together, as a percentage of the workload's prompt pages
            (``sum ceil(input_length / P)``), int >= 1, or ``None`` for the simulator's default pool.
        host_percent: host-tier pages per lane as a percentage of the prompt pages, or ``None`` (no host
            tier unless asked for).
        window: the traffic window the requests were cut and scaled to (``sim.window.traffic_window``:
            ``{"start_s", "duration_s", "rate_scale", "requests_in_window"}``), or ``None`` (as generated or read).
    """

    name: str
    requests: tuple[Request, ...] | TraceStream
    chunk_pages: int | None
    description: str
    pool_percent: int | None = None
    host_percent: int | None = None
    window: dict | None = None

    def __post_init__(self) -> None:
        if self.name not in WORKLOAD_NAMES:
            raise ConfigError(f"workload {self.name!r} is unknown; use one of {', '.join(WORKLOAD_NAMES)}")
        for name in ("chunk_pages", "pool_percent", "host_percent"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        if not isinstance(self.requests, TraceStream):
            object.__setattr__(self, "requests", tuple(self.requests))

    def prompt_pages(self, page_size: int) -> int:
        """Pages of all prompts at ``page_size`` tokens per page: ``sum ceil(input_length / P)``."""
        return sum(-(-r.input_length // page_size) for r in self.requests)


_DESCRIPTIONS = {
    "synthetic": "synthetic, seed {seed}: log-normal prompts, Poisson arrivals, shared prefixes",
    "tiny-chunks": "tiny chunks, seed {seed}: concurrent burst prefilled one page a chunk",
    "tiny-chunks-reload": "tiny chunks with reload, seed {seed}: follow-up bursts reload prefixes from the host tier",
    "short-prompts": "short prompts, seed {seed}: one- and two-page prompts arriving one at a time",
}


def build_workload(
    name: str,
    *,
    num_requests: int | None = None,
    seed: int = 0,
    trace_path: str | os.PathLike[str] | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> WorkloadSpec:
    """Build the workload ``name`` (one of ``WORKLOAD_NAMES``).

    ``num_requests`` overrides the generator's default count (``tiny-chunks-reload``: the first
    ``num_requests`` of ``ceil(num_requests / 3)`` three-turn conversations), or for ``"trace"`` caps the
    lines read (``max_requests``); ``seed`` seeds the
    generators (unused by ``"trace"``); ``trace_path`` is required for ``"trace"`` and rejected otherwise;
    ``page_size`` (tokens per page) sizes the short prompts. The specs carry the settings each workload is
    meant to run with (``SimConfig.for_workload`` applies them):

    ============================  ===========  ==================================  ==================
    workload                      chunk pages  pool (all lanes)                    host tier per lane
    ============================  ===========  ==================================  ==================
    synthetic, trace              default      default (16,384 pages per lane)     none
    tiny-chunks                   1            125 % of the prompt pages           none
    tiny-chunks-reload            1            17 % of the prompt pages            100 % of them
    short-prompts                 default      125 % of the prompt pages           none
    ============================  ===========  ==================================  ==================

    Raises:
        ConfigError: unknown name, ``trace_path`` missing for ``"trace"`` or given for a generator, a
            bad count, seed or page size, or a count whose requests would need more than
            ``cpkv.limits.MAX_ARRAY_BYTES`` (``REQUEST_BYTES`` each).
        TraceError: the trace cannot be read or is malformed (see ``trace.load_trace``).
    """
    if name not in WORKLOAD_NAMES:
        raise ConfigError(f"workload {name!r} is unknown; use one of {', '.join(WORKLOAD_NAMES)}")
    if (name == "trace") != (trace_path is not None):
        raise ConfigError(
            f"trace_path is required for workload 'trace' and only for it; got {name!r}, "
            f"trace_path={trace_path!r}"
        )
    count = {} if num_requests is None else {"num_requests": num_requests}
    if num_requests is not None and name != "trace":  # a trace's lines are checked as they are read
        check_int("num_requests", num_requests, 1)
        check_bytes(
            f"a {name} workload of {num_requests:,} requests",
            REQUEST_BYTES * num_requests,
            ConfigError,
            "lower num_requests (cpkv simulate --max-requests)",
        )
    if name == "trace":
        assert trace_path is not None  # checked above: given exactly for "trace"
        stream = TraceStream(trace_path, max_requests=num_requests)
        return WorkloadSpec(
            name=name,
            requests=stream,
            chunk_pages=None,
            description=f"Mooncake trace {os.fspath(trace_path)}",
        )
    settings: dict = {"chunk_pages": None}
    if name == "synthetic":
        requests = synthetic_workload(seed=seed, **count)
    elif name == "tiny-chunks":
        requests = tiny_chunks_workload(seed=seed, **count)
        settings = {"chunk_pages": TINY_CHUNKS_CHUNK_PAGES, "pool_percent": 125}
    elif name == "tiny-chunks-reload":
        conversations = {} if num_requests is None else {"num_conversations": -(-num_requests // 3)}
        requests = tiny_chunks_reload_workload(seed=seed, **conversations)[:num_requests]
        settings = {"chunk_pages": TINY_CHUNKS_CHUNK_PAGES, "pool_percent": 17, "host_percent": 100}
    else:
        requests = short_prompts_workload(seed=seed, page_size=page_size, **count)
        settings = {"chunk_pages": None, "pool_percent": 125}
    return WorkloadSpec(
        name=name, requests=tuple(requests), description=_DESCRIPTIONS[name].format(seed=seed), **settings
    )


# --------------------------------------------------------------------------------------------- stats


def workload_stats(requests: Iterable[Request]) -> dict[str, int | float]:
    """Summary of a workload for report headers, in one pass over ``requests`` (a stream is read once).

    Returns a dict: ``num_requests``; ``prompt_tokens_total``, ``prompt_tokens_max`` (ints, tokens);
    ``prompt_tokens_mean``, ``output_tokens_mean`` (floats, tokens); ``duration_ms`` (last minus first
    arrival, float ms); ``repeated_block_share`` (float in [0, 1]: block occurrences whose id occurred
    earlier, over all block occurrences). An empty workload gives zeros. Memory: ``DistinctIds``' (a few
    numbers when block ids are numbered in order of first appearance, as in the Mooncake traces).
    """
    n = prompt_total = prompt_max = output_total = 0
    first = last = 0.0
    ids, batch = DistinctIds(), []
    for r in requests:
        if n == 0:
            first = last = r.arrival_ms
        n += 1
        prompt_total += r.input_length
        prompt_max = max(prompt_max, r.input_length)
        output_total += r.output_length
        first, last = min(first, r.arrival_ms), max(last, r.arrival_ms)
        batch.append(r.hash_ids)
        if len(batch) == _STATS_BATCH:
            ids.add(np.fromiter(itertools.chain.from_iterable(batch), dtype=np.int64))
            batch.clear()
    ids.add(np.fromiter(itertools.chain.from_iterable(batch), dtype=np.int64))
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
    # the means as numpy's of the int64 arrays: exact float sums below 2**53 tokens, then one division
    return {
        "num_requests": n,
        "prompt_tokens_total": prompt_total,
        "prompt_tokens_mean": float(np.float64(prompt_total) / n),
        "prompt_tokens_max": prompt_max,
        "output_tokens_mean": float(np.float64(output_total) / n),
        "duration_ms": float(last - first),
        "repeated_block_share": (ids.seen - ids.distinct) / ids.seen if ids.seen else 0.0,
    }


_STATS_BATCH = 8192  # requests whose block ids workload_stats counts at once


class DistinctIds:
    """Counts the distinct ids (ints >= 0) of a stream of int64 batches, exactly, in bounded memory when ids are
    numbered in order of first appearance (0, 1, 2, ... as they first occur, the Mooncake traces' numbering).

    Holds ``dense`` (every id below it was seen) and ``sparse``, the sorted ids seen at or above it: with dense
    numbering ``sparse`` keeps about one batch; with any other numbering it grows to the distinct ids (as a set
    would). Attributes: ``seen`` (ids added, with repeats), ``distinct``. Example: batches [0, 1, 1] and [3, 2]:
    seen 5, distinct 4, dense 4, sparse empty.
    """

    def __init__(self) -> None:
        self.seen = 0
        self.dense = 0
        self.sparse = np.zeros(0, dtype=np.int64)

    @property
    def distinct(self) -> int:
        return self.dense + int(self.sparse.size)

    def add(self, ids: np.ndarray) -> None:
        """Count the int64 ``ids`` (any shape, any order)."""
        self.seen += int(ids.size)
        new = np.unique(ids[ids >= self.dense])
        if new.size:
            self.sparse = np.union1d(self.sparse, new)
        gap = self.sparse - np.arange(self.dense, self.dense + self.sparse.size)  # >= 0, non-decreasing
        k = int(np.count_nonzero(gap == 0))  # the ids that continue dense
        self.dense += k
        self.sparse = self.sparse[k:]
