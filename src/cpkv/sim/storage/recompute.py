"""``prefill_tokens_recomputed``: prompt tokens a request computes although the group had computed them
before and handed them to its prefix cache (SPEC C-STORAGE; docs/metrics.md).

The group "has computed" page j of a prompt once a request whose first ``(j + 1) * P`` tokens are the
same retired and inserted them (``P`` the compute page, whatever the design's cache unit). At admission a
request could have found, at best, the longest run of leading pages of its prompt (less its last token)
the group has computed; what it matched in the real cache falls short of that by the tokens it must
recompute: lost to eviction, to a cache too small, or to a cache unit coarser than a page
(``interleaved-vblock`` matches whole virtual blocks of ``P * C`` tokens only).

A prompt's tokens are a function of its block ids (``trace.prompt_token_ids``: ``hash_ids``, blocks of
``TRACE_BLOCK_TOKENS`` = S tokens), so two prompts agree on their first ``(j + 1) * P`` tokens exactly when
they agree on the ids of the blocks those tokens lie in (up to the 2**(-30 P) chance that two ids give one
page of tokens). The counter therefore keys block prefixes, not pages: key ``b`` of a prompt is a 64-bit
hash chained over its ids ``0 .. b``, and the record maps a key to the most tokens (whole pages) a retired
request with that block prefix computed. Page j, which ends in block ``((j + 1) * P - 1) // S``, is computed
exactly when that block's key records at least ``(j + 1) * P`` tokens. The work is O(blocks) per request
(a prompt's tokens are never read), the record one entry per block prefix computed.

The record keeps the last ``MAX_COMPUTED_KEYS`` to ``2 * MAX_COMPUTED_KEYS`` block prefixes written (two
generations; the older is dropped when the newer fills), so a day-scale replay holds a bounded record: exact
while a replay computes fewer than ``MAX_COMPUTED_KEYS`` block prefixes (the whole Mooncake conversation trace
computes well under a million), after that "computed before" means within the last two to four million
block prefixes written.
"""

from __future__ import annotations

from ..trace import TRACE_BLOCK_TOKENS, Request

MAX_COMPUTED_KEYS = 1 << 21
"""Block prefixes per generation of ``RecomputeCounter``'s record (module docstring): 2,097,152, about 100 bytes
each in a dict, so at most about 420 MB for both generations."""


class RecomputeCounter:
    """Counts ``prefill_tokens_recomputed`` over one replay (module docstring).

    Args:
        page_size: tokens per page (P) of the compute plan.
        block_size: tokens per block id of the requests' ``hash_ids`` (S, ``TRACE_BLOCK_TOKENS``).
    """

    def __init__(self, page_size: int, block_size: int = TRACE_BLOCK_TOKENS) -> None:
        self.page_size, self.block_size = page_size, block_size
        self._computed: dict[
            int, int
        ] = {}  # block-prefix key -> most tokens computed with that prefix (newer)
        self._older: dict[int, int] = {}  # the generation before it (MAX_COMPUTED_KEYS keys)
        self._keys: dict[int, list[int]] = {}  # req_id -> its prompt's block keys, admission to retirement
        self.tokens = 0

    @staticmethod
    def block_keys(hash_ids, blocks: int) -> list[int]:
        """Keys of the first ``blocks`` block prefixes of a prompt with block ids ``hash_ids``: key b is a
        64-bit hash (Python's, of ints: the same in every process) chained over ids ``0 .. b``."""
        key = 0
        return [key := hash((key, block_id)) for block_id in hash_ids[:blocks]]

    def admitted(self, req: Request, matched: int) -> int:
        """Count request ``req`` admitted with ``matched`` prompt tokens from the cache; returns the tokens it
        recomputes: ``P * (leading pages of its prompt less its last token the group had computed) -
        matched``, at least 0."""
        P, S = self.page_size, self.block_size
        keys = self._keys[req.req_id] = self.block_keys(req.hash_ids, len(req.hash_ids))
        pages = (req.input_length - 1) // P
        if not pages or not (self._computed or self._older):
            return 0
        lo = 0  # leading pages known computed
        newer, older = self._computed.get, self._older.get
        while lo < pages:
            block = ((lo + 1) * P - 1) // S  # the block page lo ends in
            got = newer(keys[block])  # the newer generation's record, else the older's, else 0
            done = (older(keys[block], 0) if got is None else got) // P  # pages ending in it, computed below
            if done <= lo:
                break
            lo = min(done, (block + 1) * S // P, pages)  # the last page ending in this block, at most
        lost = max(0, lo * P - matched)
        self.tokens += lost
        return lost

    def retired(self, req: Request, n: int) -> None:
        """Request ``req`` handed its first ``n`` prompt tokens to the cache: their whole pages are computed."""
        P, S, computed = self.page_size, self.block_size, self._computed
        keys = self._keys.pop(req.req_id, None)
        tokens = n // P * P
        if not tokens:
            return
        blocks = (tokens - 1) // S + 1
        if keys is None:  # not admitted (a rejected request hands over what it computed)
            keys = self.block_keys(req.hash_ids, blocks)
        # a prefix's record is at least any longer prefix's: stop at one as long
        older = self._older.get
        for key in reversed(keys[:blocks]):
            got = computed.get(key)  # as in admitted: newer, else older, else 0
            if (older(key, 0) if got is None else got) >= tokens:
                break
            computed[key] = tokens
        if len(computed) >= MAX_COMPUTED_KEYS:  # a new generation: the oldest block prefixes are forgotten
            self._older, self._computed = computed, {}
