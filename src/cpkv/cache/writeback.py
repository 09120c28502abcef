"""Write-back of evicted runs to the host tier (SPEC section 8, C-RELOAD).

``write_back`` decides, page by page over the runs ``PrefixCache.evict`` took off the device, ancestors
first: a page below a page dropped in this call is dropped too; a page with a host copy keeps it; otherwise
its owner lane's shard takes a new copy, making room by dropping its least recently used unpinned copy not
evicted by this call, or the page (and everything below it) is dropped. The decisions are made first, then
``backup_fn`` runs for every new copy, and only then does the cache change: an exception of ``backup_fn``
leaves host tier and tree as they were. Why ancestors first: docs/prefix-cache.md.
"""

from __future__ import annotations

import numpy as np

from .results import HKEY, LANE, PAGE


def write_back(cache, order: list) -> None:
    """Write back (or drop) the pages of ``order``: the runs one ``evict`` call took off the device,
    ancestors first, their pages still in ``vals`` (``cache.evict`` frees them afterwards).

    Raises:
        Whatever ``cache.backup_fn`` raises, before any change.
    """
    actions, writes = _decide(cache, order)
    fn = cache.backup_fn
    payloads = iter([fn(int(n.vals[i, PAGE])) if fn is not None else None for n, i in writes])
    for n in order:  # from here on nothing raises
        n.vals[:, PAGE] = -1
        n.in_batch = False
    book = cache.book
    for kind, n, i in actions:  # in the order decided: room freed by a drop is used by later copies
        if kind == "write":
            key = book.new_host_key()
            cache.host.put(key, int(n.vals[i, LANE]), next(payloads))
            n.vals[i, HKEY] = key
            book.host_loc[key] = n
            book.count("backups")
        elif kind == "cut":
            book.count("host_dropped", _drop_from(cache, n, i))
        else:  # a victim: i is its key
            node = book.host_loc[i]
            j = int(np.flatnonzero(node.vals[:, HKEY] == i)[0])
            book.count("host_evictions")
            if node.dev:
                cache.host.pop(i, int(node.vals[j, LANE]))
                del book.host_loc[i]
                node.vals[j, HKEY] = -1
            else:
                book.count("host_dropped", _drop_from(cache, node, j) - 1)


def _decide(cache, order: list) -> tuple[list, list]:
    """``(actions, writes)``: what to do, in order, as ``("write", run, page index)``, ``("victim",
    None, key)`` (a copy dropped to make room) and ``("cut", run, page index)`` (the run's pages from
    there on, and its subtree, are dropped); ``writes`` lists the new copies alone."""
    count = cache.host.count_per_lane()  # [C] copies per shard as the decisions go
    cap = cache.host.capacity
    gone: set = set()  # keys of the copies the decisions drop
    lru: dict = {}  # lane -> iterator over its keys, least recently used first
    actions, writes, dead = [], [], set()
    for n in order:
        if n.parent in dead:
            dead.add(n)
            continue
        for i, (key, r) in enumerate(zip(n.vals[:, HKEY].tolist(), n.vals[:, LANE].tolist(), strict=True)):
            if key >= 0:
                continue
            if count[r] >= cap[r]:
                victim = _victim(cache, r, lru, gone, count)
                if victim is None:
                    actions.append(("cut", n, i))
                    _forget(cache, n, i, gone, count)
                    dead.add(n)  # its children are below the cut
                    break
                actions.append(("victim", None, victim))
            count[r] += 1
            actions.append(("write", n, i))
            writes.append((n, i))
    return actions, writes


def _victim(cache, lane: int, lru: dict, gone: set, count: np.ndarray):
    """The key of the copy ``lane``'s shard drops to make room, or None when every copy is pinned or
    evicted by this call. A key passed over stays ineligible for the whole call: one scan per shard."""
    keys = lru.get(lane)
    if keys is None:
        keys = lru[lane] = iter(cache.host.lru_keys(lane))
    for key in keys:
        node = cache.book.host_loc[key]
        if key in gone or node.in_batch or (not node.dev and node.lock_ref > 0):
            continue
        if node.dev:
            gone.add(key)
            count[lane] -= 1
        else:
            _forget(cache, node, int(np.flatnonzero(node.vals[:, HKEY] == key)[0]), gone, count)
        return key
    return None


def _forget(cache, node, j: int, gone: set, count: np.ndarray) -> None:
    """Count as dropped every copy of ``node``'s pages from ``j`` on and of its subtree."""
    for k, n in enumerate(cache.tree.preorder(node)):
        rows = n.vals[j if k == 0 else 0 :]
        for key, lane in rows[rows[:, HKEY] >= 0][:, [HKEY, LANE]].tolist():
            if key not in gone:
                gone.add(key)
                count[lane] -= 1


def _drop_from(cache, node, j: int) -> int:
    """Remove ``node``'s pages from ``j`` on and its subtree (no device page among them), with their
    host copies; returns the copies dropped."""
    if j:
        cache.tree.split(node, j)
    dropped = 0
    for n in cache.tree.detach(node):
        rows = n.vals[n.vals[:, HKEY] >= 0]
        for key, lane in rows[:, [HKEY, LANE]].tolist():
            cache.host.pop(key, lane)
            del cache.book.host_loc[key]
            dropped += 1
    return dropped
