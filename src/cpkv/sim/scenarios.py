"""Seeded workloads that reproduce lane skew: the seed's incident and its relatives (SPEC sections 1 and 4).

- ``tiny_chunks_workload``: a burst of concurrent requests prefilled in one-page chunks. ``legacy`` (phase
  0) puts every chunk's page on lane 0: lane 0 fills while the other lanes stay empty (the first half of
  the seed's incident, C-ROTATION-SPREADS).
- ``tiny_chunks_reload_workload``: the whole incident. Tiny-chunk conversations come back for more turns
  after their prefixes were backed up to the host tier and evicted, so load-back must land on the
  recorded owner lanes (C-RELOAD): under ``legacy`` every recorded lane is lane 0, which running requests
  keep full, and the load-backs fail.
- ``short_prompts_workload``: prompts of one or two whole pages arriving one at a time. Every such request
  has prefix 0 and batch index 0, so ``rotation`` gives it phase 0 like ``legacy``: every first page lands
  on lane 0 (C-PHASE's case for ``balanced``).

Prompts are whole 512-token blocks where a later turn must extend an earlier prompt (block ids name
block contents, so a shared leading run of ids is a shared prefix; see ``trace.prompt_token_ids``).
"""

from __future__ import annotations

import numpy as np

from ..config import DEFAULT_PAGE_SIZE, check_int
from ..errors import ConfigError
from .trace import TRACE_BLOCK_TOKENS, Request

TINY_CHUNKS_CHUNK_PAGES = 1
"""Prefill chunk size, in pages, that the tiny-chunk workloads are meant to run with (one page a chunk)."""


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
    seed = check_int("seed", seed, 0, None)
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


def tiny_chunks_reload_workload(
    num_conversations: int = 64,
    seed: int = 0,
    *,
    turns: int = 3,
    min_prompt_blocks: int = 4,
    max_prompt_blocks: int = 16,
    min_turn_blocks: int = 1,
    max_turn_blocks: int = 4,
    warmup_ms: float = 120_000.0,
    turn_gap_ms: float = 30_000.0,
    burst_ms: float = 1_000.0,
    max_output_tokens: int = 256,
) -> list[Request]:
    """Tiny-chunk conversations whose follow-up turns reload their prefix from the host tier (C-RELOAD).

    First turns arrive one at a time, conversation c at ``c * warmup_ms / num_conversations`` (a pace even
    ``legacy`` keeps), each with a prompt of ``[min_prompt_blocks, max_prompt_blocks]`` fresh 512-token
    blocks. Follow-up turn j (1 ..
    ``turns - 1``) of every conversation arrives in a burst at ``warmup_ms + (j - 1) * turn_gap_ms`` plus
    a uniform ``[0, burst_ms)``; its prompt is the previous prompt (the same block ids: a prefix hit) plus
    ``[min_turn_blocks, max_turn_blocks]`` fresh blocks (the reply and the next user message). Run with
    one-page chunks, a host tier, and a device pool smaller than the first turns
    (``SimConfig.for_workload``): by the time the follow-ups arrive their prefixes were evicted to the
    host tier with their recorded owner lanes, and load-back must put them back there. Under ``legacy``
    every recorded lane is lane 0, which the burst's one-page chunks fill.

    Returns:
        ``num_conversations * turns`` ``Request`` records sorted by arrival (``req_id`` in that order).

    Raises:
        ConfigError: a count or length that is not an int in range, a minimum above its maximum, or a
            time that is not a finite number >= 0.
    """
    num_conversations = check_int("num_conversations", num_conversations, 1)
    seed = check_int("seed", seed, 0, None)
    turns = check_int("turns", turns, 1)
    min_prompt_blocks = check_int("min_prompt_blocks", min_prompt_blocks, 1)
    max_prompt_blocks = check_int("max_prompt_blocks", max_prompt_blocks, min_prompt_blocks)
    min_turn_blocks = check_int("min_turn_blocks", min_turn_blocks, 1)
    max_turn_blocks = check_int("max_turn_blocks", max_turn_blocks, min_turn_blocks)
    max_output_tokens = check_int("max_output_tokens", max_output_tokens, 1)
    for name, value in (("warmup_ms", warmup_ms), ("turn_gap_ms", turn_gap_ms), ("burst_ms", burst_ms)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    rng = np.random.default_rng(seed)
    rows = []  # (arrival_ms, conversation, block ids, output tokens)
    next_id = 0
    for c in range(num_conversations):
        ids: tuple[int, ...] = ()
        for turn in range(turns):
            if turn == 0:
                t, low, high = c * warmup_ms / num_conversations, min_prompt_blocks, max_prompt_blocks
            else:
                t = warmup_ms + (turn - 1) * turn_gap_ms + float(rng.uniform(0.0, burst_ms))
                low, high = min_turn_blocks, max_turn_blocks
            new = int(rng.integers(low, high, endpoint=True))
            ids = ids + tuple(range(next_id, next_id + new))
            next_id += new
            rows.append((t, c, ids, int(rng.integers(1, max_output_tokens, endpoint=True))))
    rows.sort(key=lambda row: row[:2])
    return [Request(i, t, len(ids) * TRACE_BLOCK_TOKENS, out, ids) for i, (t, _, ids, out) in enumerate(rows)]


def short_prompts_workload(
    num_requests: int = 256,
    seed: int = 0,
    *,
    page_size: int = DEFAULT_PAGE_SIZE,
    gap_ms: float = 25.0,
    max_output_tokens: int = 64,
) -> list[Request]:
    """Prompts of one or two whole pages (``page_size`` or ``2 * page_size`` tokens, equally likely) arriving
    one at a time, every ``gap_ms`` ms (longer than a step, so every batch holds one request), no shared
    blocks.

    Every request has prefix 0 and batch index 0, so ``rotation`` and ``legacy`` give it phase 0: its first
    page lands on lane 0 (and a second page on lane 1), every time, and the prefix cache keeps them there.
    With the pool ``SimConfig.for_workload`` sizes (a quarter larger than all the prompts' pages), lane 0
    fills and evicts while six lanes stay empty; ``balanced`` sends each request to the lanes with the
    most free pages and evicts nothing.

    Returns:
        ``num_requests`` ``Request`` records, request i arriving at ``i * gap_ms`` ms.

    Raises:
        ConfigError: a count or size that is not an int in range, or a gap that is not a finite number > 0.
    """
    num_requests = check_int("num_requests", num_requests, 1)
    seed = check_int("seed", seed, 0, None)
    page_size = check_int("page_size", page_size, 1)
    max_output_tokens = check_int("max_output_tokens", max_output_tokens, 1)
    if isinstance(gap_ms, bool) or not isinstance(gap_ms, (int, float)) or not 0 < gap_ms < float("inf"):
        raise ConfigError(f"gap_ms must be a finite number > 0, got {gap_ms!r}")
    rng = np.random.default_rng(seed)
    prompt = page_size * rng.integers(1, 2, size=num_requests, endpoint=True)
    output = rng.integers(1, max_output_tokens, size=num_requests, endpoint=True)
    requests, next_id = [], 0
    for i in range(num_requests):
        length = int(prompt[i])
        ids = tuple(range(next_id, next_id + -(-length // TRACE_BLOCK_TOKENS)))
        next_id += len(ids)
        requests.append(Request(i, i * float(gap_ms), length, int(output[i]), ids))
    return requests
