"""Workloads of the distributed reference executor: requests' token ids and the forwards that run them.

A workload is plain data that every rank holds identically (built from the same arguments and seed): the
token ids of each request, and for each forward the batch as ``(request id, end position)`` pairs in batch
order. A forward advances each listed request from what is already in its KV (its earlier chunks, or a
prefix-cache hit on its first forward) to ``end``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import check_int
from ..errors import PlanError
from ..limits import check_bytes


@dataclass(frozen=True)
class Workload:
    """Requests and forwards (plain, picklable data).

    Attributes:
        requests: token ids per request id (tuple of tuples of ints in ``[0, vocab_size)``).
        forwards: per forward, ``((request_id, end), ...)`` in batch order; ``end`` (tokens) is the
            position the request reaches; each request appears at most once per forward.
        flush_before: forward indices before which every unlocked prefix-cache page is evicted (written
            back to the host tier when it has room), so the forward's hits load back from host (C-RELOAD).
        decode_after: forward indices after which the requests whose prompts are done are decoded
            together (``DistCase.decode_steps``); after the last forward they always are. (A request held
            for decode keeps its cache lock, so a flush cannot evict its pages.)
    """

    requests: tuple[tuple[int, ...], ...]
    forwards: tuple[tuple[tuple[int, int], ...], ...]
    flush_before: frozenset[int] = frozenset()
    decode_after: frozenset[int] = frozenset()

    def total_pages(self, page_size: int, extra_tokens: int = 0) -> int:
        """Pages that hold every request at once, each with ``extra_tokens`` more (decode):
        ``sum(ceil((len + extra) / P))`` (an upper bound on live pages)."""
        return sum(-(-(len(t) + extra_tokens) // page_size) for t in self.requests)


def split_lengths(total: int, parts: int) -> list[int]:
    """``total`` tokens in ``parts`` near-equal chunks, larger first; e.g. ``(7, 3) -> [3, 2, 2]``."""
    base, rem = divmod(total, parts)
    return [base + (k < rem) for k in range(parts)]


def make_workload(
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    *,
    chunks: int = 1,
    vocab_size: int = 512,
    seed: int = 0,
    reuse: bool = False,
    reload: bool = False,
) -> Workload:
    """The standard workload: prefix fill, chunked extends, then an optional prefix-cache reuse wave.

    Request i (i < B) has ``prefix_len + extend_len`` random tokens. Forward 0 (only when some prefix
    is non-empty) computes each request's first ``prefix_len`` tokens, so the next forward sees exactly
    that prefix in the KV (page aligned or not). Then ``extend_len`` is cut into ``chunks`` near-equal
    chunks, one forward each (chunked prefill; empty chunks are skipped).

    With ``reuse``, a second wave: request ``B + i`` is request i's whole prompt plus ``max(1, E_i // 2)``
    fresh tokens, run in two forwards after wave 1; its first forward hits the prefix cache (page
    aligned), its second continues its own chunk. With ``reload`` the cache is flushed to the host tier
    before wave 2, so those hits load back. Decode steps (``DistCase.decode_steps``) run after the last
    forward, for every request at once; with ``reload`` wave 1 is decoded (and released) before the
    flush, so its pages can go to the host tier.

    Args:
        prefix_lens, extend_lens: ``[B]`` tokens per request (ints >= 0, ``extend_len >= 1`` each).
        chunks: forwards over which each extend is spread (>= 1).
        vocab_size: token ids are drawn from ``[0, vocab_size)``.
        seed: token seed.
        reuse, reload: as above (``reload`` implies ``reuse``).

    Raises:
        PlanError: mismatched lists, no request, a negative length or a zero extend (names the request);
            token ids above ``cpkv.limits.MAX_ARRAY_BYTES`` (48 B per token as Python tuples, checked first).
        ConfigError: ``chunks`` or ``vocab_size`` below 1.
    """
    chunks = check_int("chunks", chunks, 1)
    vocab_size = check_int("vocab_size", vocab_size, 1)
    if len(prefix_lens) != len(extend_lens) or not extend_lens:
        raise PlanError(
            f"give one prefix_len per extend_len, at least one (got {len(prefix_lens)} and {len(extend_lens)})"
        )
    for i, (L0, E) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        check_int(f"request {i}: prefix_len", L0, 0)
        if check_int(f"request {i}: extend_len", E, 0) == 0:
            raise PlanError(
                f"request {i}: extend_len=0; every request of the workload computes at least one token"
            )
    tokens = sum(prefix_lens) + sum(extend_lens)
    tokens += tokens + sum(max(1, E // 2) for E in extend_lens) if reuse or reload else 0
    check_bytes(
        f"a run-dist workload of {tokens:,} tokens",
        48 * tokens,
        PlanError,
        "the reference executor is for small checks",
    )
    rng = np.random.default_rng(seed)
    B = len(extend_lens)
    requests = [
        tuple(rng.integers(0, vocab_size, L0 + E).tolist())
        for L0, E in zip(prefix_lens, extend_lens, strict=True)
    ]
    forwards: list[tuple[tuple[int, int], ...]] = []
    if any(prefix_lens):
        forwards.append(tuple((i, L0) for i, L0 in enumerate(prefix_lens) if L0 > 0))
    ends = [
        np.cumsum([L0, *split_lengths(E, chunks)]).tolist()
        for L0, E in zip(prefix_lens, extend_lens, strict=True)
    ]
    for k in range(1, chunks + 1):
        step = tuple((i, ends[i][k]) for i in range(B) if ends[i][k] > ends[i][k - 1])
        if step:
            forwards.append(step)
    flush: set[int] = set()
    decode_after = {len(forwards) - 1} if reload else set()  # decode wave 1 before the flush lets go
    if reuse or reload:
        fresh = [max(1, E // 2) for E in extend_lens]
        for i in range(B):
            requests.append(requests[i] + tuple(rng.integers(0, vocab_size, fresh[i]).tolist()))
        if reload:
            flush.add(len(forwards))
        full = [len(t) for t in requests[B:]]
        forwards.append(tuple((B + i, full[i] - fresh[i] // 2) for i in range(B)))
        second = tuple((B + i, full[i]) for i in range(B) if fresh[i] // 2 > 0)
        if second:
            forwards.append(second)
    return Workload(
        requests=tuple(requests),
        forwards=tuple(forwards),
        flush_before=frozenset(flush),
        decode_after=frozenset(decode_after),
    )
