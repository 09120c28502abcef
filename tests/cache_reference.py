"""Per-page reference model of the prefix cache (SPEC section 8), for differential tests.

Plain Python, one node per page, every choice by a linear scan: no runs, no heaps, no numpy in its
logic and no production helper. It drives its own ``OwnerLaneAllocator`` (the allocator is not under
test here) and states the cache's rules directly:
- a use (match, insert, load-back, the last unlock) stamps the pages of its path with one new stamp;
- ``evict(lane, n)``: while fewer than n pages of ``lane`` are freed, take the unlocked device page of
  ``lane`` with the smallest ``(stamp, -depth)`` and its device subtree (parents first, children in
  insertion order); then write back over the steps in reverse, each in that order, and free every page
  in one call in the same order;
- write-back, page by page: below a dropped page: dropped; has a copy: keeps it; else a new copy if the
  lane has room or its LRU copy can go (not pinned by a load-back, not evicted by this call); else the
  page and its subtree are dropped;
- a handle is ``(page, generation)``: stale once the page left the device; locks count per handle.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import strategies as st

# Prompts for the cache's property tests: a cut of one of a few base prompts plus a short random tail,
# over a 3-token vocabulary, so that prompts share prefixes often and diverge inside runs.
BASES = ([1, 2, 3, 1] * 6, [1, 2, 3, 2] * 6, [3] * 24, [2, 1] * 12)
PROMPTS = st.builds(
    lambda b, cut, tail: (BASES[b][:cut] + tail) or [1],
    st.integers(0, len(BASES) - 1),
    st.integers(0, 24),
    st.lists(st.integers(1, 3), max_size=5),
)


class Page:
    __slots__ = (
        "parent",
        "children",
        "depth",
        "page",
        "lane",
        "key",
        "lock_ref",
        "own",
        "stamp",
        "gen",
        "alive",
        "leaving",
    )

    def __init__(self, parent, depth):
        self.parent, self.children, self.depth = parent, {}, depth
        self.page, self.lane, self.key = -1, -1, None  # device page, owner lane, host copy id
        self.lock_ref = self.own = self.stamp = self.gen = 0
        self.alive, self.leaving = True, False


class RefError(Exception):
    """The model's refusal (the cache raises PrefixCacheError in the same cases)."""


class RefCache:
    def __init__(self, alloc, host_pages_per_lane):
        self.alloc, self.C, self.P = alloc, alloc.config.cp_size, alloc.config.page_size
        caps = host_pages_per_lane
        self.caps = list(caps) if isinstance(caps, (list, tuple)) else [caps] * self.C
        self.root = Page(None, -1)
        self.clock = self.next_key = 0
        self.host = [OrderedDict() for _ in range(self.C)]  # lane -> key -> page node, LRU first
        self.n = dict.fromkeys(
            (
                "hits",
                "misses",
                "inserted_pages",
                "duplicate_pages",
                "backups",
                "host_evictions",
                "host_dropped",
                "load_backs",
                "load_back_owner_lane_capacity_failed",
                "load_back_failed_pages",
            ),
            0,
        )
        self.evicted, self.collateral = [0] * self.C, [0] * self.C

    # ------------------------------------------------------------------------------------- queries
    def walk(self, tokens):
        path, node = [], self.root
        for i in range(len(tokens) // self.P):
            node = node.children.get(tuple(tokens[i * self.P : (i + 1) * self.P]))
            if node is None:
                break
            path.append(node)
        return path

    def pages(self, node=None):
        """Every page node, parents first, children in insertion order."""
        out, stack = [], list(reversed((node or self.root).children.values()))
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(n.children.values()))
        return out

    def entries(self):
        return [(n.depth, n.page, n.lane, n.key is not None, n.lock_ref, n.key) for n in self.pages()]

    def handle(self, node):
        return (node, node.gen)

    def match(self, tokens, record=True):
        path = self.walk(tokens)
        dev = [n for n in path if n.page >= 0]
        host = path[len(dev) :]
        if record:
            self.n["hits" if path else "misses"] += 1
            self.touch(path)
        return [n.page for n in dev], [n.lane for n in host], self.handle(dev[-1] if dev else self.root), host

    # ------------------------------------------------------------------------------------- updates
    def touch(self, path):
        self.clock += 1
        for n in path:
            n.stamp = self.clock
        for n in reversed(path):
            if n.key is not None:
                self.host[n.lane].move_to_end(n.key)

    def adjust(self, node, delta):
        crossed = []
        while node is not self.root:
            node.lock_ref += delta
            if node.lock_ref == 0:
                crossed.append(node)
            node = node.parent
        if crossed:
            self.clock += 1
            for n in crossed:
                n.stamp = self.clock

    def lock(self, handle):
        node, gen = handle
        if node is not self.root and (not node.alive or node.page < 0 or node.gen != gen):
            raise RefError("stale")
        node.own += 1
        self.adjust(node, 1)

    def unlock(self, handle):
        node, gen = handle
        if node is not self.root and (not node.alive or node.gen != gen) or node.own == 0:
            raise RefError("unlock without lock")
        node.own -= 1
        self.adjust(node, -1)

    def insert(self, tokens, slots):
        P, C = self.P, self.C
        k = len(tokens) // P
        path, node, dup, new = self.walk(tokens[: k * P]), self.root, [], 0
        for i in range(k):
            p = slots[i * P] // P
            if i < len(path):
                node = path[i]
                if node.page >= 0:
                    if node.page != p:
                        dup.append(p)
                    continue
                if node.key is not None and node.lane != p % C:
                    self.drop_copy(node)
                    self.n["host_dropped"] += 1
            else:
                child = Page(node, i)
                node.children[tuple(tokens[i * P : (i + 1) * P])] = child
                node = child
                path.append(node)
            node.page, node.lane = p, p % C
            new += 1
        if dup:
            self.alloc.free(dup)
        self.n["inserted_pages"] += new
        self.n["duplicate_pages"] += len(dup)
        self.touch(path)
        return [n.page for n in path], dup, new, self.handle(path[-1] if path else self.root)

    def evict(self, lane, num_pages):
        steps, freed = [], 0
        while freed < num_pages:
            cands = [
                n
                for n in self.pages()
                if n.page >= 0 and not n.leaving and n.lock_ref == 0 and n.lane == lane
            ]
            if not cands:
                break
            x = min(cands, key=lambda n: (n.stamp, -n.depth))
            step = [x] + [n for n in self.pages(x) if n.page >= 0 and not n.leaving]  # device pages: no gap
            for n in step:
                n.leaving = True
                n.gen += 1
                freed += n.lane == lane
                self.evicted[n.lane] += 1
                self.collateral[n.lane] += n.lane != lane
            steps.append(step)
        order = [n for step in reversed(steps) for n in step]
        pages = [n.page for n in order]
        for n in order:
            if not n.alive:
                continue
            if n.key is None and not self.room(n.lane):
                self.remove(n)  # the page and everything below it
                continue
            if n.key is None:
                n.key = self.next_key
                self.next_key += 1
                self.host[n.lane][n.key] = n
                self.n["backups"] += 1
            n.page = -1
        for n in order:
            n.leaving = False
        if pages:
            self.alloc.free(pages)
        return freed

    def room(self, lane):
        if self.caps[lane] == 0:
            return False
        if len(self.host[lane]) < self.caps[lane]:
            return True
        for node in self.host[lane].values():
            if node.leaving or (node.page < 0 and node.lock_ref > 0):
                continue
            self.n["host_evictions"] += 1
            if node.page >= 0:
                self.drop_copy(node)
            else:
                self.drop_copy(node)
                self.remove(node)
            return True
        return False

    def drop_copy(self, node):
        del self.host[node.lane][node.key]
        node.key = None

    def remove(self, node):
        del node.parent.children[next(k for k, v in node.parent.children.items() if v is node)]
        for n in [node] + self.pages(node):
            if n.key is not None:
                self.drop_copy(n)
                self.n["host_dropped"] += 1
            n.alive = False

    def load_back(self, dev_pages, host_nodes, handle):
        if not host_nodes:
            return dev_pages, handle
        lanes = [n.lane for n in host_nodes]
        self.adjust(host_nodes[-1], 1)
        for r in sorted(set(lanes)):
            short = lanes.count(r) - int(self.alloc.free_pages_per_lane()[r])
            if short > 0:
                self.evict(r, short)
        free, seen, j = self.alloc.free_pages_per_lane().tolist(), [0] * self.C, 0
        for r in lanes:
            if seen[r] >= free[r]:
                break
            seen[r] += 1
            j += 1
        pages = self.alloc.alloc_pages(lanes[:j]).tolist()
        for n, p in zip(host_nodes[:j], pages, strict=True):
            n.page = p
        self.n["load_backs"] += j
        self.adjust(host_nodes[-1], -1)
        if j < len(lanes):
            self.n["load_back_owner_lane_capacity_failed"] += 1
            self.n["load_back_failed_pages"] += len(lanes) - j
        last = host_nodes[j - 1] if j else handle[0]
        path, n = [], last
        while n is not self.root:
            path.append(n)
            n = n.parent
        self.touch(path[::-1])
        return dev_pages + pages, (self.handle(last) if j else handle)
