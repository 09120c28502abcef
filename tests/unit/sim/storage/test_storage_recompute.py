"""The recomputed-prefill figure of the storage designs (SPEC C-STORAGE, ``RecomputeCounter``): the tokens of
pages computed before whose KV the cache no longer had."""

import numpy as np
import pytest

from cpkv.sim.storage.recompute import RecomputeCounter
from cpkv.sim.trace import Request, prompt_token_ids

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]


def test_recomputed_tokens_are_the_computed_pages_the_cache_no_longer_had():
    c = RecomputeCounter(page_size=4)
    a = Request(0, 0.0, 12, 0, (5,))
    assert c.admitted(a, 0) == 0  # nothing computed yet
    c.retired(a, 12)  # 3 pages computed
    b = Request(1, 0.0, 14, 0, (5,))  # shares all 12 tokens: pages of b's prompt less its last token -> 3
    assert c.admitted(b, 12) == 0 and c.admitted(b, 4) == 8 and c.admitted(b, 0) == 12
    other = Request(2, 0.0, 14, 0, (6,))
    assert c.admitted(other, 0) == 0
    assert c.admitted(a, 0) == 8  # a's own last token is never matched: its first 2 pages
    assert c.tokens == 8 + 12 + 8
    c.retired(other, 6)  # a rejected request hands over what it computed: one page
    assert c.admitted(Request(4, 0.0, 9, 0, (6,)), 0) == 4


@pytest.mark.parametrize("page_size", [1, 3, 4, 8, 12])
def test_block_keyed_counter_equals_counting_token_prefixes(page_size):
    """The counter keys block prefixes; a reference keyed by the token prefixes themselves (exact tuples of
    ``prompt_token_ids``) gives the same tokens on random prompts sharing block prefixes (blocks of 8
    tokens: pages inside blocks, across them, and longer than one)."""
    rng = np.random.default_rng(page_size)
    S, P = 8, page_size
    c = RecomputeCounter(P, block_size=S)
    computed: set[tuple] = set()  # token prefixes of whole pages retired
    expected = 0
    for req_id in range(300):
        length = int(rng.integers(1, 60))
        hash_ids = tuple(int(h) for h in rng.integers(0, 3, size=-(-length // S)))  # 3 ids: much sharing
        req = Request(req_id, 0.0, length, 0, hash_ids)
        tokens = prompt_token_ids(req, S).tolist()
        matched = int(rng.integers(0, length)) // P * P
        lo = 0
        while lo < (length - 1) // P and tuple(tokens[: (lo + 1) * P]) in computed:
            lo += 1
        expected += max(0, lo * P - matched)
        assert c.admitted(req, matched) == max(0, lo * P - matched)
        n = int(rng.integers(0, length + 1))
        c.retired(req, n)
        computed.update(tuple(tokens[: (j + 1) * P]) for j in range(n // P))
    assert c.tokens == expected > 0
