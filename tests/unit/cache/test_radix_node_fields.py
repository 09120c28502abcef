"""The per-node fields the radix tree and the LRU keep instead of recomputing them (``RadixNode.end``,
``RadixNode.key``, ``LaneLRU``'s memo) against their definitions, after any sequence of leaf adds, splits
and detaches: ``end == start + num_pages`` (and a split leaves the lower part's ``end`` as it was), ``key``
is the bytes of the first page's token ids and the node's entry in its parent's ``children``, and the memo
holds the lane counts of ``vals[:, LANE]`` (array, lanes present, and the same counts as ints).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.cache.lru import LaneLRU
from cpkv.cache.prefix_cache import CacheNode
from cpkv.cache.radix import RadixTree
from cpkv.cache.results import LANE

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-RELOAD")]

P, C = 2, 4


def check_fields(tree: RadixTree) -> None:
    for n in tree.nodes():
        assert n.end == n.start + n.num_pages
        assert n.key == n.tokens[:P].tobytes()
        assert n.parent.children[n.key] is n
        assert n.start == n.parent.end
    assert tree.root.end == 0 and tree.root.key == b""


def check_memo(lru: LaneLRU, n) -> None:
    counts = lru.counts(n)
    expect = np.bincount(n.vals[:, LANE], minlength=C)
    assert counts.tolist() == expect.tolist()
    assert n.memo[1] == np.flatnonzero(expect).tolist()
    assert n.memo[2] == expect.tolist() and all(type(k) is int for k in n.memo[2])


def new_vals(k: int, first: int) -> np.ndarray:
    vals = np.full((k, 3), -1, dtype=np.int64)
    vals[:, 0] = np.arange(first, first + k)
    vals[:, LANE] = vals[:, 0] % C
    return vals


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "split", "detach"]), st.integers(0, 10**6)), max_size=30))
def test_end_key_and_memo_follow_adds_splits_and_detaches(ops):
    tree = RadixTree(P, 3, CacheNode)
    lru = LaneLRU(C)
    page = 1
    for op, r in ops:
        live = [tree.root, *tree.nodes()]
        if op == "add":
            parent = live[r % len(live)]
            k = 1 + r % 5
            tokens = np.arange(k * P, dtype=np.int64) + 1000 * (r % 97) + 7 * len(parent.children)
            if tokens[:P].tobytes() in parent.children:
                continue
            node = tree.add_leaf(parent, tokens, new_vals(k, page))
            page += k
            assert node.end == parent.end + k and node.key == tokens[:P].tobytes()
        elif len(live) > 1:
            node = live[1 + r % (len(live) - 1)]
            if op == "split" and node.num_pages > 1:
                end, at = node.end, 1 + r % (node.num_pages - 1)
                check_memo(lru, node)
                upper = tree.split(node, at, lower_goes=bool(r % 2))
                node.memo = None  # as the cache's on_split (LaneLRU.forget)
                assert node.end == end and upper.end == node.start == upper.start + at
                check_memo(lru, upper)
                check_memo(lru, node)
            elif op == "detach":
                key, parent = node.key, node.parent
                gone = tree.detach(node)
                assert key not in parent.children and gone[0] is node
                assert all(not g.attached for g in gone)
        check_fields(tree)
