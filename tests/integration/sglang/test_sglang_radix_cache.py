"""SGLang's own ``RadixCache`` and scheduler functions driving the owner-lane allocator.

Requests share prompt prefixes. Each one is admitted the way SGLang's scheduler does it: ``match_prefix``,
lock the match, ``alloc_paged_token_slots_extend`` (which asks the allocator for its demand and evicts
through it), a few ``alloc_paged_token_slots_decode`` steps; at the end ``insert`` into the tree, free the
duplicated pages and the unaligned tail with ``free_kv_row_segments``, unlock. After every step the two
sides' page accounting agrees: tree pages, pages of running requests and free pages partition the pool,
and the tree's own sizes add up. At cp_size=1 the same run on SGLang's ``PagedTokenToKVPoolAllocator``
gives the same slots and sizes at every step.
"""

import types
from array import array

import numpy as np
import pytest
import torch
from sglang_workload import i64

sgl = pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
radix = pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.mem_cache.allocation import (  # noqa: E402
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
)
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.common import free_kv_row_segments  # noqa: E402

from cpkv import OWNER_POLICIES  # noqa: E402

pytestmark = pytest.mark.sglang

P, RANK_PAGES = 4, 24


@pytest.fixture(autouse=True)
def ordered_clock(monkeypatch):
    """A strictly increasing clock for the tree's LRU stamps: two trees run in lockstep evict alike."""
    ticks = iter(range(1, 1 << 62))
    fake = types.SimpleNamespace(monotonic=lambda: float(next(ticks)), perf_counter=radix.time.perf_counter)
    monkeypatch.setattr(radix, "time", fake)


class Engine:
    """One tree and its allocator; running requests keep (tokens, row, matched prefix, lock)."""

    def __init__(self, alloc) -> None:
        self.alloc = alloc
        self.tree = radix.RadixCache.create_simulated(mock_allocator=alloc, page_size=P)
        self.running: dict[int, list] = {}
        self.evicted = 0  # tokens the tree evicted (the allocator asked for them)
        evict = self.tree.evict

        def counted(params):
            result = evict(params)
            self.evicted += result.num_tokens_evicted
            return result

        self.tree.evict = counted

    def admit(self, rid: int, tokens: list[int]) -> list[int]:
        match = self.tree.match_prefix(MatchPrefixParams(key=radix.RadixKey(array("q", tokens))))
        L0 = match.device_prefix_len
        prefix = self.tree.path_device_indices(match.last_device_node)[:L0]
        lock = self.tree.lock(match.last_device_node)
        last = i64([int(prefix[-1]) if L0 else -1])
        n = len(tokens)
        out = alloc_paged_token_slots_extend(
            self.tree, i64([L0]), i64([L0]), i64([n]), i64([n]), last, n - L0
        )
        self.running[rid] = [list(tokens), torch.cat([prefix, out]), L0, lock]
        return out.tolist()

    def decode(self, rid: int, token: int) -> int:
        tokens, row, _, _ = self.running[rid]
        n = len(tokens) + 1
        out = alloc_paged_token_slots_decode(self.tree, i64([n]), i64([n]), row[-1:])
        tokens.append(token)
        self.running[rid][1] = torch.cat([row, out])
        return int(out[0])

    def finish(self, rid: int) -> None:
        tokens, row, L0, lock = self.running.pop(rid)
        aligned = len(tokens) // P * P
        key = radix.RadixKey(array("q", tokens[:aligned]))
        inserted = self.tree.insert(InsertParams(key=key, value=row[:aligned].clone()))
        segments = [(row[L0 : inserted.prefix_len], L0), (row[aligned:], aligned)]  # duplicates, tail
        free_kv_row_segments(self.alloc, [(s, at) for s, at in segments if s.numel()], swa_evicted_seqlen=0)
        self.tree.unlock(lock)

    def check_accounting(self) -> None:
        values = (
            self.tree.all_values_flatten()
            if self.tree.root_node.children
            else torch.zeros(0, dtype=torch.int64)
        )
        tree_pages = (values // P).unique().tolist()
        assert self.tree.total_size() == len(tree_pages) * P  # the tree holds whole pages
        assert self.tree.evictable_size() + self.tree.protected_size() == self.tree.total_size()
        own = [p for _, row, L0, _ in self.running.values() for p in set((row[L0:] // P).tolist())]
        free = self.alloc.get_all_free_pages().tolist()
        held = tree_pages + own + free
        C = getattr(self.alloc, "cp_size", 1)  # pages 0..C-1 are padding pages
        assert sorted(held) == list(range(C, C + self.alloc.num_pages)), "a page leaked or is held twice"


def run(engines: list[Engine], seed: int, steps: int = 250) -> int:
    """Drive the engines in lockstep; returns how many admissions hit a cached prefix."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 50, size=int(rng.integers(P, 9 * P))).tolist() for _ in range(6)]
    hits, rid = 0, 0
    for _ in range(steps):
        busy = engines[0].running
        if busy and (len(busy) >= 2 or rng.random() < 0.5):
            done = int(rng.choice(sorted(busy)))
            for _ in range(int(rng.integers(0, 2 * P))):
                token = int(rng.integers(0, 50))
                assert len({e.decode(done, token) for e in engines}) == 1
            for e in engines:
                e.finish(done)
        else:
            base = prompts[int(rng.integers(len(prompts)))]
            tokens = (
                base[: int(rng.integers(1, len(base) + 1))]
                + rng.integers(0, 50, size=int(rng.integers(0, 3 * P))).tolist()
            )
            outs = [e.admit(rid, tokens) for e in engines]
            assert all(o == outs[0] for o in outs)
            hits += engines[0].running[rid][2] > 0
            rid += 1
        for e in engines:
            e.check_accounting()
        sizes = {
            (e.tree.evictable_size(), e.tree.protected_size(), e.alloc.available_size()) for e in engines
        }
        assert len(sizes) == 1
    return hits


def test_radix_cache_at_cp_size_1_matches_sglangs_allocator():
    args = (RANK_PAGES * P, P, torch.bfloat16, "cpu", None, False)
    ours = sgl.OwnerLaneTokenToKVPoolAllocator(*args, cp_size=1)
    engines = [Engine(ours), Engine(PagedTokenToKVPoolAllocator(*args))]
    assert run(engines, seed=3) >= 30
    assert engines[0].evicted == engines[1].evicted >= 20 * P


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@pytest.mark.parametrize("policy", OWNER_POLICIES)
@pytest.mark.parametrize("C", [2, 4])
def test_radix_cache_with_owner_lanes(C, policy):
    alloc = sgl.OwnerLaneTokenToKVPoolAllocator(  # 12 pages a rank: legacy's lane 0 must hold 2 requests
        12 * P, P, torch.bfloat16, "cpu", None, False, cp_size=C, owner_policy=policy
    )
    engine = Engine(alloc)
    served = []
    original = alloc.alloc_extend

    def checked(*args, **kwargs):
        out = original(*args, **kwargs)
        if out is not None:
            assert ((out // P) % C).tolist() == alloc.last_plan.token_owner.tolist()
            served.append(out.numel())
        return out

    alloc.alloc_extend = checked
    assert run([engine], seed=10 + C) >= 30
    assert len(served) >= 100 and engine.evicted >= 20 * P
