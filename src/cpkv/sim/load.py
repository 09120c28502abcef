"""The offered prefill load of a workload against what one CP group prefills: the lines ``cpkv simulate``
prints before its replay (docs/metrics.md, "Load against capacity").

Offered: the prompt tokens per second of the workload's arrivals, and the part left to prefill when every
shared prefix hits the prefix cache (``ideal_hits``: a lower bound on the work, since a finite pool evicts).
Capacity: the tokens per second the group prefills when the first requests (``SAMPLE_TOKENS`` tokens to
prefill) all wait at once, packed into steps as the simulator's scheduler packs them (``chunk_size`` per
request, ``max_batch_tokens`` per step, ``max_running`` requests) and priced by the run's cost model
(zigzag or interleave plans, rotation phases; the logits budget and the pool's limits left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import cast

import numpy as np

from ..config import CPConfig
from ..errors import ConfigError
from ..planner import plan_batch
from .config import SimConfig
from .trace import TRACE_BLOCK_TOKENS, Request

SAMPLE_TOKENS = 2_000_000
"""Tokens to prefill (after ideal hits) of the first requests that ``offered_load`` packs into steps to price
the capacity (at least one request): 123 steps of 16,384 tokens at the defaults, well under a second."""

MAX_PREFIX_KEYS = 1 << 20
"""Most distinct prompt prefixes (one per block) ``ideal_hits`` remembers (69 MiB, tracemalloc); later prefixes are
not added, so on a longer workload the hits are those of the earlier prompts' prefixes only."""

NEAR = 0.8
"""An offered load at or above this share of the capacity is said to queue in bursts."""


@dataclass(frozen=True)
class Load:
    """A workload's offered prefill load and one group's capacity (``offered_load``).

    Attributes:
        requests: requests in the workload. span_s: first to last arrival, s (0.0: one burst).
        prompt_tokens: all prompt tokens. new_tokens: prompt tokens left when every shared prefix hits.
        sample_requests: the first requests priced for the capacity; sample_tokens: their tokens to prefill;
            sample_ms: simulated ms to prefill them all, waiting at once; sample_p50_ms: the median of their
            prefill end times then (a burst's TTFT p50 when the sample is the whole burst).
        alone_ms: simulated ms to prefill one prompt of the mean size (mean hit cached), alone.
    """

    requests: int
    span_s: float
    prompt_tokens: int
    new_tokens: int
    sample_requests: int
    sample_tokens: int
    sample_ms: float
    sample_p50_ms: float
    alone_ms: float

    @property
    def capacity(self) -> float:
        """Tokens per second the group prefills (``sample_tokens / sample_ms``), 0.0 when nothing was priced."""
        return 1000.0 * self.sample_tokens / self.sample_ms if self.sample_ms > 0 else 0.0

    @property
    def burst(self) -> bool:
        """True when every request arrives at the same time (no rate to speak of)."""
        return self.span_s <= 0.0

    @property
    def ratio(self) -> float | None:
        """Offered tokens to prefill per second over the capacity; None for a burst or no capacity."""
        if self.burst or self.capacity <= 0:
            return None
        return self.new_tokens / self.span_s / self.capacity


def ideal_hits(requests: Iterable[Request], page_size: int) -> list[int]:
    """Prompt tokens of each request an unbounded prefix cache would hold when it arrives: its longest
    leading run of blocks that was a leading run of an earlier prompt, in whole pages, at most
    ``input_length - 1`` (one token is always computed). Prefixes are remembered up to ``MAX_PREFIX_KEYS``.

    Example (``page_size`` 64): prompts of blocks (1, 2, 3) then (1, 2, 9), 1,536 tokens each: hits 0 and
    1,024 (blocks 1 and 2)."""
    return [hit for _, hit in _with_hits(requests, page_size)]


def _with_hits(requests: Iterable[Request], page_size: int) -> Iterator[tuple[Request, int]]:
    """``(request, its ideal hit)`` in order, one request at a time (``ideal_hits``)."""
    seen: set[int] = set()
    for r in requests:
        key, matched, open_ = 0, 0, True
        for block in r.hash_ids:
            key = hash((key, block))
            if open_ and key in seen:
                matched += 1
                continue
            open_ = False
            if len(seen) < MAX_PREFIX_KEYS:
                seen.add(key)
        hit = min(matched * TRACE_BLOCK_TOKENS, r.input_length - 1)
        yield r, hit - hit % page_size


def prefill_ms(config: SimConfig, cost, prefixes: list[int], todo: list[int]) -> np.ndarray:
    """Simulated ms at which each request's prefill ends, float64 ``[len(todo)]`` (0.0 for ``todo[i] == 0``),
    when request ``i`` has ``todo[i]`` tokens to prefill after ``prefixes[i]`` cached ones and all wait from
    0 ms: each step admits requests in order up to ``config.max_running``, gives each running one up to
    ``config.chunk_size`` tokens until ``config.max_batch_tokens`` are taken, and lasts ``cost.overhead_ms +
    max(cost.step_work(plan))`` (``cost``: a ``cpkv.cost.StepCost``, SPEC C-COST). The last step ends at the
    maximum."""
    cp = CPConfig(config.cp_size, config.page_size, owner_policy="rotation", cp_strategy=config.cp_strategy)
    done, left = list(prefixes), list(todo)
    end = np.zeros(len(todo))
    queue = [i for i, n in enumerate(left) if n > 0][::-1]
    running: list[int] = []
    now = 0.0
    while queue or running:
        budget = config.max_batch_tokens
        step_prefix, step_extend, step_of = [], [], []
        while queue and len(running) < config.max_running:
            running.append(queue.pop())
        for i in running:
            if budget <= 0:
                break
            n = min(left[i], config.chunk_size, budget)
            step_prefix.append(done[i])
            step_extend.append(n)
            step_of.append(i)
            budget -= n
        heads = [-1 if p % config.page_size == 0 else 0 for p in step_prefix]
        plan = plan_batch(np.asarray(step_prefix), np.asarray(step_extend), cp, head_owners=heads)
        now += cost.overhead_ms + float(np.max(cost.step_work(plan)))
        for i, n in zip(step_of, step_extend, strict=True):
            done[i] += n
            left[i] -= n
            if left[i] == 0:
                end[i] = now
        running = [i for i in running if left[i] > 0]
    return end


def offered_load(config: SimConfig, requests: Iterable[Request], cost) -> Load:
    """The ``Load`` of ``requests`` (in arrival order) on the group of ``config`` priced by ``cost`` (the
    replay's ``StepCost``): the ideal hits of every request, then the first ones (``SAMPLE_TOKENS``) priced.
    One pass over ``requests`` (a stream is read once and not held).

    Raises:
        ConfigError: no request."""
    prefixes, todo, sampled = [], [], 0
    n = prompt = hit = 0
    first_ms = last_ms = 0.0
    for r, h in _with_hits(requests, config.page_size):
        if n == 0:
            first_ms = r.arrival_ms
        last_ms = r.arrival_ms
        n += 1
        prompt += r.input_length
        hit += h
        if sampled < SAMPLE_TOKENS:
            prefixes.append(h)
            todo.append(r.input_length - h)
            sampled += todo[-1]
    if not n:
        raise ConfigError("offered_load needs at least one request, got none")
    end = prefill_ms(config, cost, prefixes, todo)
    P = config.page_size
    mean_hit = hit // n - hit // n % P
    alone = prefill_ms(config, cost, [mean_hit], [max(1, round(prompt / n) - mean_hit)])
    return Load(
        requests=n,
        span_s=(last_ms - first_ms) / 1000.0,
        prompt_tokens=prompt,
        new_tokens=prompt - hit,
        sample_requests=len(todo),
        sample_tokens=sampled,
        sample_ms=float(end.max()),
        sample_p50_ms=float(np.median(end)),
        alone_ms=float(alone[0]),
    )


def load_lines(load: Load, config: SimConfig, priced_by: str) -> list[str]:
    """What ``load`` means for TTFT, in three lines (offered, capacity, meaning); ``priced_by`` names the cost
    model (e.g. ``measured h200_sxm``). Example, the default synthetic workload (1,000 requests)::

        load: 1,000 requests over 257 s offer 39,548 prompt tokens/s, 24,330/s to prefill if every shared ...
        capacity: one C=8 group prefills about 18,491 tokens/s (8,192-token chunks, at most 16,384 tokens ...
        -> offered 1.3x capacity: requests queue for the whole run and TTFT is mostly that wait (the last ...
    """
    group = f"one C={config.cp_size} group prefills about {load.capacity:,.0f} tokens/s"
    how = (
        f"{config.chunk_size:,}-token chunks, at most {config.max_batch_tokens:,} tokens a step, {priced_by}"
    )
    if load.burst:
        whole = load.sample_requests == load.requests
        drain = load.sample_ms / 1000 if whole else load.new_tokens / load.capacity
        median = f"TTFT p50 about {load.sample_p50_ms / 1000:,.1f} s, " if whole else ""
        return [
            f"load: {load.requests:,} requests arrive at once: {load.prompt_tokens:,} prompt tokens, "
            f"{load.new_tokens:,} to prefill",
            f"capacity: {group} ({how})",
            f"-> the burst takes about {drain:,.1f} s to prefill: {median}the last TTFT about {drain:,.1f} s, "
            "when the pool holds it and the policy spreads its pages over the lanes",
        ]
    ratio = cast(float, load.ratio)  # not a burst (returned above); a capacity of 0 would give None here
    head = [
        f"load: {load.requests:,} requests over {load.span_s:,.0f} s offer {load.prompt_tokens / load.span_s:,.0f} "
        f"prompt tokens/s, {load.new_tokens / load.span_s:,.0f}/s to prefill if every shared prefix hits the cache",
        f"capacity: {group} ({how})",
    ]
    if ratio >= 1.0:
        wait = load.span_s * (ratio - 1.0)
        return [
            *head,
            f"-> offered {ratio:.1f}x capacity: requests queue for the whole run and TTFT is mostly that "
            f"wait (the last arrival waits at least about {wait:,.0f} s); more groups: cpkv sweep, "
            "groups = search (docs/sweep.md)",
        ]
    alone = f"{load.alone_ms / 1000:,.1f} s" if load.alone_ms >= 1000 else f"{load.alone_ms:,.0f} ms"
    tail = (
        "; near capacity, bursts of arrivals queue and TTFT p99 rises far above p50" if ratio >= NEAR else ""
    )
    return [
        *head,
        f"-> offered {ratio:.0%} of capacity: TTFT is mostly a prompt's own prefill ({alone} for one of "
        f"the mean size, alone) plus waits in bursts{tail}",
    ]
