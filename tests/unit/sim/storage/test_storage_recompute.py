"""The recomputed-prefill figure of the storage designs (SPEC C-STORAGE, ``RecomputeCounter``): the tokens of
pages computed before whose KV the cache no longer had."""

import pytest

from cpkv.sim.storage.recompute import RecomputeCounter
from cpkv.sim.trace import Request, prompt_token_ids

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]


def test_recomputed_tokens_are_the_computed_pages_the_cache_no_longer_had():
    c = RecomputeCounter(page_size=4)
    a = prompt_token_ids(Request(0, 0.0, 12, 0, (5,)))
    assert c.admitted(0, a, 0) == 0  # nothing computed yet
    c.retired(0, a, 12)  # 3 pages computed
    b = prompt_token_ids(Request(1, 0.0, 14, 0, (5,)))  # shares all 12 tokens: pages of b[:-1] -> 3
    assert c.admitted(1, b, 12) == 0 and c.admitted(1, b, 4) == 8 and c.admitted(1, b, 0) == 12
    other = prompt_token_ids(Request(2, 0.0, 14, 0, (6,)))
    assert c.admitted(2, other, 0) == 0
    assert c.admitted(3, a, 0) == 8  # a's own last token is never matched: its first 2 pages
    assert c.tokens == 8 + 12 + 8
    c.retired(2, other, 6)  # a rejected request hands over what it computed: one page
    assert c.admitted(4, prompt_token_ids(Request(4, 0.0, 9, 0, (6,))), 0) == 4
