"""MTP speculative decoding in the simulator: draft slots, seeded acceptance, rollback (SPEC C-DRAFT).

One decode step with ``--spec-draft-tokens K`` (K >= 1; SGLang's ``speculative_num_draft_tokens``, root
included) models what MTP / EAGLE do to the KV pool:

1. ``alloc_draft``: each decoding request of length ``L`` (tokens whose KV is cached) gets K slots,
   positions ``L .. L+K-1``: the root (the token emitted last, whose KV the verify pass writes) and K-1
   draft tokens. Pages and lanes follow the extend rule (C-DRAFT), so draft pages rotate or balance.
2. Verify: draft j (j = 1 .. K-1) is accepted with probability A when drafts 1 .. j-1 were (geometric
   per token). Each request draws from its own generator seeded with ``(seed, req_id)``, so a request's
   acceptances are the same under every policy and batch composition.
3. With ``a`` drafts accepted the request keeps ``1 + a`` positions (root + accepted drafts:
   ``new_len = L + 1 + a``) and emits ``a + 1`` tokens (the accepted drafts and the bonus token the target
   samples after them; the bonus is the next step's root). Both are capped at the request's remaining
   output tokens. ``release_tail`` then frees the pages whose first position is ``>= new_len``.

K = 1 is plain decode (one slot, always kept). The verify pass costs K decode tokens per request in the
cost model (the step's decode plan); the draft model's own forward is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..allocator import ExtendAllocation
from ..allocator.protocol import PageAllocator
from ..cache.flow import request_part

_I64 = np.int64


class SpecDecoder:
    """Draft slots, acceptance and rollback of one policy's replay, with its counters (C-DRAFT).

    Args:
        alloc: the group's allocator (a ``PageAllocator``). num_draft_tokens: K >= 1, slots per request
            per step. accept_rate: A in [0, 1], per-draft acceptance probability. seed: run seed.
    """

    def __init__(self, alloc: PageAllocator, num_draft_tokens: int, accept_rate: float, seed: int) -> None:
        self.alloc = alloc
        self.num_draft_tokens = num_draft_tokens
        self.accept_rate = accept_rate
        self.seed = seed
        self._rngs: dict[int, np.random.Generator] = {}
        self.draft_pages_per_lane = np.zeros(
            alloc.capacity_per_lane.shape[0], dtype=_I64
        )  # [lanes] pages alloc_draft took
        self.draft_pages_released = 0
        self.verify_steps = 0  # request-steps verified
        self.kept_tokens = 0  # tokens emitted (= KV positions kept) over all request-steps
        self.accepted_drafts = 0  # drafts accepted (before the cap at the remaining output)

    def alloc_draft(self, seq_lens: Sequence[int], last_locs: Sequence[int]) -> ExtendAllocation:
        """``alloc.alloc_draft(seq_lens, last_locs, K)``, counting the draft pages per lane. Raises as it."""
        return self.count_draft(self.alloc.alloc_draft(seq_lens, last_locs, self.num_draft_tokens))

    def count_draft(self, a: ExtendAllocation) -> ExtendAllocation:
        """Count the draft pages of a step's K-slot allocation ``a`` per lane (however it was allocated:
        ``alloc_draft``, or the plan a scheduler sized and committed); returns ``a``."""
        self.draft_pages_per_lane += np.bincount(
            a.new_pages % self.draft_pages_per_lane.shape[0], minlength=self.draft_pages_per_lane.shape[0]
        )
        return a

    def verify(
        self,
        a: ExtendAllocation,
        req_ids: Sequence[int],
        seq_lens: Sequence[int],
        remaining: Sequence[int],
        rows: Sequence[np.ndarray],
    ) -> list[tuple[int, int]]:
        """Accept, keep and roll back each request of the step ``a`` allocated.

        Args:
            a: the step's ``alloc_draft`` result. req_ids: ``[B]`` request ids (acceptance seeds).
            seq_lens: ``[B]`` lengths before the step. remaining: ``[B]`` output tokens still to emit (>= 1).
            rows: ``[B]`` the requests' ``req_to_token`` rows (slot of every position ``< seq_len``).

        Returns:
            Per request ``(tokens, pages)``: the positions ``seq_len .. new_len - 1`` it keeps (the tokens it
            emits, the first of its K slots) and the new pages it keeps (the first of its new pages), the
            counts ``RequestKV.take(a, i, tokens, pages)`` appends; the other new pages went back to their
            lanes through ``release_tail``.
        """
        K, P = self.num_draft_tokens, self.alloc.page_size
        kept = []
        for i, rid in enumerate(req_ids):
            accepted = self._accepted(int(rid))
            n = min(accepted + 1, int(remaining[i]))
            new = request_part(a, i)[1]
            pages = new.shape[0]
            if n < K and pages:  # only the step's new pages can start at or after new_len
                held = np.concatenate([rows[i][0 : seq_lens[i] : P] // P, new])  # position order
                freed = self.alloc.release_tail(held, seq_lens[i] + n)
                pages -= freed.shape[0]
                self.draft_pages_released += freed.shape[0]
            if n == remaining[i]:
                self._rngs.pop(int(rid), None)  # the request finishes this step
            self.verify_steps += 1
            self.accepted_drafts += accepted
            self.kept_tokens += n
            kept.append((n, pages))
        return kept

    def _accepted(self, req_id: int) -> int:
        """Drafts accepted in this request's next verify step: leading successes of K-1 draws < A."""
        if self.num_draft_tokens == 1:
            return 0
        rng = self._rngs.get(req_id)
        if rng is None:
            rng = self._rngs[req_id] = np.random.default_rng((self.seed, req_id))
        ok = rng.random(self.num_draft_tokens - 1) < self.accept_rate
        return int(ok.argmin()) if not ok.all() else ok.shape[0]

    def metrics(self) -> dict:
        """The report's speculative-decoding figures (defined in docs/metrics.md)."""
        lanes = self.draft_pages_per_lane
        mean = float(lanes.mean())
        steps = self.verify_steps  # no verify step (or no draft page): null, not a perfect-looking 0 or 1.0
        return {
            "spec_verify_steps": steps,
            "spec_accept_length": self.kept_tokens / steps if steps else None,
            "spec_accepted_drafts_per_step": self.accepted_drafts / steps if steps else None,
            "draft_pages_allocated": int(lanes.sum()),
            "draft_pages_released": self.draft_pages_released,
            "draft_pages_per_lane": lanes.tolist(),
            "draft_lane_imbalance": float(lanes.max()) / mean if mean > 0 else None,
        }
