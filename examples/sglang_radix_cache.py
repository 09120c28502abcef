"""SGLang 0.5.23's own RadixCache and prefill allocation on cpkv's owner-lane allocator (cp_size=2).

Four prompts share a 12-token system prompt: the first misses, the next ones hit the cache, and a long
prompt makes SGLang evict. Each line shows the cached prefix, the rank that computes (and stores) every
new token, and the pool. Run after `make test-sglang` built the venv:
    .venv-sglang/bin/python examples/sglang_radix_cache.py
"""

from array import array

import torch

from cpkv.integrations.cpu_stubs import install_torchvision_stub

install_torchvision_stub()  # SGLang imports torchvision; no CPU build of it imports with torch 2.13

from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_extend  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

from cpkv.integrations.sglang import OwnerLaneTokenToKVPoolAllocator  # noqa: E402

P, C = 4, 2  # tokens per page, ranks; each rank's pool holds 6 pages (+ its padding page)
alloc = OwnerLaneTokenToKVPoolAllocator(
    6 * P, P, torch.bfloat16, "cpu", None, False, cp_size=C, owner_policy="balanced"
)
tree = RadixCache.create_simulated(mock_allocator=alloc, page_size=P)


def prefill(tokens: list[int]) -> None:
    """Admit one prompt as SGLang's scheduler does, then cache it in the tree as a finished request."""
    one = lambda v: torch.tensor([v])  # noqa: E731
    match = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
    L0, node = match.device_prefix_len, match.last_device_node
    prefix, lock, before = tree.path_device_indices(node)[:L0], tree.lock(node), tree.total_size()
    last = one(int(prefix[-1]) if L0 else -1)
    n = len(tokens)
    out = alloc_paged_token_slots_extend(
        tree, one(L0), one(L0), one(n), one(n), last, n - L0
    )  # evicts if short
    owners = alloc.last_plan.token_owner.tolist()  # the rank that computes each new token
    assert [(s // P) % C for s in out.tolist()] == owners  # ... and owns its KV page (C-OWNER-EQ-COMPUTE)
    row, aligned = torch.cat([prefix, out]), n // P * P
    cached = tree.insert(
        InsertParams(key=RadixKey(array("q", tokens[:aligned])), value=row[:aligned].clone())
    )
    alloc.free(row[L0 : cached.prefix_len])  # pages another request cached meanwhile (none here)
    alloc.free(row[aligned:])  # the partly filled last page is not cached
    tree.unlock(lock)
    evicted = before + aligned - cached.prefix_len - tree.total_size()
    print(
        f"{n:3d} tokens: cached {L0:2d}, new on rank 0/1 {owners.count(0):2d}/{owners.count(1):2d}, evicted "
        f"{evicted:2d}, tree {tree.total_size():2d}, free floor {alloc.available_size():2d}"
    )


system = list(range(100, 112))
for prompt in (
    system + [1, 2, 3, 4, 5, 6],
    system + [7, 8, 9, 10],
    system + [1, 2, 3, 4, 9],
    list(range(40)),
):
    prefill(prompt)
