"""``prefill_tokens_recomputed``: prompt tokens a request computes although the group had computed them
before and handed them to its prefix cache (SPEC C-STORAGE; docs/metrics.md).

The group "has computed" page j of a prompt once a request whose first ``(j + 1) * P`` tokens are the
same retired and inserted them (``P`` the compute page, whatever the design's cache unit). At admission a
request could have found, at best, the longest run of leading pages of its prompt (less its last token)
the group has computed; what it matched in the real cache falls short of that by the tokens it must
recompute: lost to eviction, to a cache too small, or to a cache unit coarser than a page
(``interleaved-vblock`` matches whole virtual blocks of ``P * C`` tokens only).

Pages are keyed by a 64-bit hash of the whole token prefix they end (each page's tokens hashed, mixed with
its index, summed along the prompt), so a key names the prefix, not the page alone. The counter remembers the
last ``MAX_COMPUTED_KEYS`` to ``2 * MAX_COMPUTED_KEYS`` keys computed (two generations; the older is dropped
when the newer fills), so a day-scale replay holds a bounded set: exact while a replay computes fewer than
``2 * MAX_COMPUTED_KEYS`` keys (the whole Mooncake conversation trace computes about 1.4 million), after that
"computed before" means within the last two to four million pages computed.
"""

from __future__ import annotations

import numpy as np

from ..trace import splitmix64

_U64 = np.uint64

MAX_COMPUTED_KEYS = 1 << 21
"""Keys per generation of ``RecomputeCounter``'s memory (module docstring): 2,097,152, about 76 bytes each in a
Python set, so at most about 320 MB for both generations."""


class RecomputeCounter:
    """Counts ``prefill_tokens_recomputed`` over one replay (module docstring).

    Args:
        page_size: tokens per page (P) of the compute plan.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._mult = splitmix64(np.arange(page_size, dtype=_U64)) | _U64(1)  # [P] odd multipliers
        self._salt = np.zeros(0, dtype=_U64)  # [pages] salt of each page index, grown on demand
        self._seen: set[int] = set()  # the newer generation of computed keys
        self._older: set[int] = set()  # the generation before it (MAX_COMPUTED_KEYS keys)
        self._keys: dict[
            int, np.ndarray
        ] = {}  # req_id -> keys of its prompt's pages, admission to retirement
        self.tokens = 0

    def prefix_keys(self, token_ids: np.ndarray, pages: int) -> np.ndarray:
        """Keys of the first ``pages`` whole pages of ``token_ids`` (int64), uint64 ``[pages]``: key j names
        tokens ``0 .. (j + 1) * P - 1``."""
        P = self.page_size
        if self._salt.shape[0] < pages:
            self._salt = splitmix64(np.arange(max(pages, 2 * self._salt.shape[0]), dtype=_U64))
        blocks = token_ids[: pages * P].view(_U64).reshape(pages, P)
        with np.errstate(over="ignore"):
            page_hash = (blocks * self._mult).sum(axis=1, dtype=_U64)  # wraps mod 2**64
            return np.cumsum(splitmix64(page_hash ^ self._salt[:pages]), dtype=_U64)

    def admitted(self, req_id: int, token_ids: np.ndarray, matched: int) -> int:
        """Count request ``req_id`` admitted with ``matched`` prompt tokens from the cache; returns the
        tokens it recomputes: ``P * (leading pages of token_ids[:-1] the group had computed) - matched``, at
        least 0."""
        keys = self.prefix_keys(token_ids, token_ids.shape[0] // self.page_size)
        self._keys[req_id] = keys
        pages = (token_ids.shape[0] - 1) // self.page_size
        if not pages or not (self._seen or self._older):
            return 0
        seen, older = self._seen, self._older
        lo, hi = 0, pages  # the computed pages are a prefix-closed set: the longest run by binary search
        while lo < hi:
            mid = (lo + hi + 1) // 2
            key = int(keys[mid - 1])
            lo, hi = (mid, hi) if key in seen or key in older else (lo, mid - 1)
        lost = max(0, lo * self.page_size - matched)
        self.tokens += lost
        return lost

    def retired(self, req_id: int, token_ids: np.ndarray, n: int) -> None:
        """Request ``req_id`` handed its first ``n`` prompt tokens to the cache: their whole pages are computed."""
        pages = n // self.page_size
        keys = self._keys.pop(req_id, None)
        if keys is None or keys.shape[0] < pages:
            keys = self.prefix_keys(token_ids, pages)
        if pages:
            self._seen.update(keys[:pages].tolist())
            if len(self._seen) >= MAX_COMPUTED_KEYS:  # a new generation: the oldest keys are forgotten
                self._older, self._seen = self._seen, set()
