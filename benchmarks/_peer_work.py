"""The work bench_vs_sglang.py gives both contenders: allocator calls and the prefix-cache replay.

Each contender is a small class with the same methods; every method builds its untimed state, times only
the contender's own calls (their argument tensors / arrays included, as an engine would build them) and
returns seconds, plus what the caller checks (slots, hit tokens). ``Cpkv*`` drive cpkv, ``SGLang*`` drive
SGLang's ``PagedTokenToKVPoolAllocator`` and ``RadixCache`` (loaded by ``_sglang_peer.load``).
"""

from __future__ import annotations

import time
from array import array
from collections import defaultdict

import numpy as np
import torch

from cpkv import CPConfig, LaneExhausted, OwnerLaneAllocator, PrefixCache

STEPS = ("match", "lock", "evict", "alloc", "insert", "unlock", "free")


# ------------------------------------------------------------------------------------------ allocator
class CpkvAlloc:
    """cpkv's ``OwnerLaneAllocator`` with ``pages`` usable pages in all (``pages // C + 1`` per lane);
    ``plan=True`` also reads every result's ``plan`` in the timed region."""

    name = "cpkv"

    def __init__(
        self, cp_size: int, page_size: int, pages: int, policy: str = "balanced", *, plan: bool = False
    ) -> None:
        self.cfg = CPConfig(cp_size, page_size, policy)
        self.pages, self.P = pages, page_size
        self.with_plan = plan  # also read each result's .plan (built on first access for small calls)

    def fresh(self) -> OwnerLaneAllocator:
        return OwnerLaneAllocator(self.cfg, self.pages // self.cfg.cp_size + 1)

    def extend_free(self, extend_len: int, calls: int) -> float:
        """Seconds of ``calls`` x (``alloc_extend`` of one fresh request of ``extend_len`` tokens, then ``free``)."""
        alloc, total = self.fresh(), 0.0
        for _ in range(calls):
            t0 = time.perf_counter()
            res = alloc.alloc_extend(
                np.zeros(1, np.int64), np.full(1, extend_len, np.int64), np.full(1, -1, np.int64)
            )
            if self.with_plan:
                res.plan  # noqa: B018
            alloc.free(res.new_pages)
            total += time.perf_counter() - t0
        return total

    def extend(self, alloc, prefix_lens, extend_lens, last_locs) -> np.ndarray:
        """``out_cache_loc`` of one untimed ``alloc_extend`` (for the checks)."""
        return alloc.alloc_extend(prefix_lens, extend_lens, last_locs).out_cache_loc.numpy()

    def decode(self, seq_lens: np.ndarray, steps: int) -> tuple[float, np.ndarray]:
        """Prefill requests of ``seq_lens`` tokens (untimed), then time ``steps`` decode steps of all of them.

        Returns ``(seconds, out_cache_loc of every step [steps, B])``."""
        alloc = self.fresh()
        B = seq_lens.shape[0]
        pre = alloc.alloc_extend(
            np.zeros(B, np.int64), seq_lens, np.full(B, -1, np.int64)
        ).out_cache_loc.numpy()
        last = pre[np.cumsum(seq_lens) - 1]
        seq, outs, total = seq_lens.copy(), [], 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            res = alloc.alloc_decode(seq, last)
            if self.with_plan:
                res.plan  # noqa: B018
            total += time.perf_counter() - t0
            out = res.out_cache_loc
            last = out.numpy()
            outs.append(last)
            seq = seq + 1
        return total, np.stack(outs)


class SGLangAlloc:
    """SGLang's ``PagedTokenToKVPoolAllocator`` (torch-native path) with ``pages`` usable pages."""

    name = "sglang"

    def __init__(self, sg, page_size: int, pages: int) -> None:
        self.sg, self.P, self.pages = sg, page_size, pages

    def fresh(self):
        a = self.sg.Allocator(
            size=self.pages * self.P,
            page_size=self.P,
            dtype=torch.bfloat16,
            device="cpu",
            kvcache=None,
            need_sort=False,
        )
        if a.use_triton_kernels:
            raise RuntimeError(
                "SGLang chose its Triton kernels; this benchmark measures its torch-native path"
            )
        return a

    def extend_free(self, extend_len: int, calls: int) -> float:
        alloc, total = self.fresh(), 0.0
        for _ in range(calls):
            t0 = time.perf_counter()
            out = self._extend(alloc, [0], [extend_len], [-1])
            alloc.free(out)
            total += time.perf_counter() - t0
        return total

    def extend(self, alloc, prefix_lens, extend_lens, last_locs) -> np.ndarray:
        out = self._extend(alloc, prefix_lens, extend_lens, last_locs)
        if out is None:
            raise RuntimeError("SGLang's allocator is out of pages in a check that must fit")
        return out.numpy()

    @staticmethod
    def _extend(alloc, prefix_lens, extend_lens, last_locs):
        L0 = torch.tensor(np.asarray(prefix_lens, dtype=np.int64))
        seq = L0 + torch.tensor(np.asarray(extend_lens, dtype=np.int64))
        last = torch.tensor(np.asarray(last_locs, dtype=np.int64))
        return alloc.alloc_extend(L0, L0, seq, seq, last, int(np.sum(extend_lens)))

    def decode(self, seq_lens: np.ndarray, steps: int) -> tuple[float, np.ndarray]:
        alloc = self.fresh()
        B = seq_lens.shape[0]
        pre = self.extend(alloc, np.zeros(B, np.int64), seq_lens, np.full(B, -1, np.int64))
        last = torch.from_numpy(pre[np.cumsum(seq_lens) - 1])
        seq, outs, total = torch.from_numpy(seq_lens + 1), [], 0.0  # SGLang's seq_lens count the new token
        for _ in range(steps):
            t0 = time.perf_counter()
            out = alloc.alloc_decode(seq, seq, last)
            total += time.perf_counter() - t0
            if out is None:
                raise RuntimeError("SGLang's allocator is out of pages during the decode case")
            last = out
            outs.append(out.numpy())
            seq = seq + 1
        return total, np.stack(outs)


class ShardedAlloc(SGLangAlloc):
    """An SGLang-facing allocator of a CP group of ``cp_size`` ranks with ``pages`` usable pages in all,
    driven through the same SGLang calls (``alloc_extend`` with SGLang's tensors, ``free`` of the slots):
    ``kind="sglang"`` is SGLang's ``PageInterleavePoolAllocator`` (its ``--enable-kv-cache-sharding``
    allocator; every request a new chain, ``rotation_bases=[None, ...]``), ``kind="cpkv"`` cpkv's
    ``OwnerLaneTokenToKVPoolAllocator`` (balanced owners). Both take one rank's pool, ``ceil(pages / C)``
    pages, as SGLang passes it."""

    def __init__(self, sg, kind: str, cp_size: int, page_size: int, pages: int) -> None:
        super().__init__(sg, page_size, pages)
        self.kind, self.C, self.name = kind, cp_size, f"{kind}_sharded"

    def fresh(self):
        size = -(-self.pages // self.C) * self.P
        if self.kind == "sglang":
            return self.sg.PageInterleaveAllocator(size, self.P, self.C, torch.bfloat16, "cpu", None, False)
        from cpkv.integrations.sglang import OwnerLaneTokenToKVPoolAllocator

        return OwnerLaneTokenToKVPoolAllocator(
            size, self.P, torch.bfloat16, "cpu", None, False, cp_size=self.C, owner_policy="balanced"
        )

    def _extend(self, alloc, prefix_lens, extend_lens, last_locs):
        L0 = torch.tensor(np.asarray(prefix_lens, dtype=np.int64))
        seq = L0 + torch.tensor(np.asarray(extend_lens, dtype=np.int64))
        last = torch.tensor(np.asarray(last_locs, dtype=np.int64))
        kw = {"rotation_bases": [None] * len(L0)} if self.kind == "sglang" else {}
        return alloc.alloc_extend(L0, L0, seq, seq, last, int(np.sum(extend_lens)), **kw)

    @staticmethod
    def call_args(prefix_lens, extend_lens, last_locs) -> tuple:
        """SGLang's ``alloc_extend`` arguments as its scheduler builds them (before the call, untimed):
        ``(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens)``, int64 CPU
        tensors (the device and host copies are one tensor on a CPU-only machine)."""
        L0 = torch.tensor(np.asarray(prefix_lens, dtype=np.int64))
        seq = L0 + torch.tensor(np.asarray(extend_lens, dtype=np.int64))
        last = torch.tensor(np.asarray(last_locs, dtype=np.int64))
        return L0, L0, seq, seq, last, int(np.sum(extend_lens))

    def bases(self, B: int, given=None) -> dict:
        """The keyword SGLang's sharded ``alloc_extend`` needs: ``rotation_bases`` of B new chains (None,
        resolved in place) or the ``given`` bases of continued chains; cpkv takes none (C-HEAD: the owner
        of each chain's last page is read from ``last_loc``)."""
        if self.kind != "sglang":
            return {}
        return {"rotation_bases": [None] * B if given is None else list(given)}

    def prompts(self, B: int, extend_len: int, calls: int) -> float:
        """Seconds of ``calls`` ``alloc_extend`` calls, each of B new prompts of ``extend_len`` tokens in one
        batch, SGLang's tensors in (built untimed) and ``out_cache_loc`` out; each call's slots are freed
        untimed, so every call sees the same pool."""
        alloc, total = self.fresh(), 0.0
        args = self.call_args([0] * B, [extend_len] * B, [-1] * B)
        for _ in range(calls):
            kw = self.bases(B)
            t0 = time.perf_counter()
            out = alloc.alloc_extend(*args, **kw)
            total += time.perf_counter() - t0
            alloc.free(out)
        return total

    def frees(self, B: int, extend_len: int, calls: int) -> float:
        """Seconds of ``calls`` x B ``free`` calls: B prompts of ``extend_len`` tokens allocated in one batch
        (untimed), then each request's slots freed by its own call, as SGLang frees a finished request."""
        alloc, total = self.fresh(), 0.0
        args = self.call_args([0] * B, [extend_len] * B, [-1] * B)
        for _ in range(calls):
            out = alloc.alloc_extend(*args, **self.bases(B))
            rows = out.split(extend_len)
            t0 = time.perf_counter()
            for row in rows:
                alloc.free(row)
            total += time.perf_counter() - t0
        return total

    def continued(self, seq_pages: np.ndarray, calls: int) -> tuple[float, np.ndarray]:
        """The decode-like call SGLang's sharded allocator takes (it has no ``alloc_decode``, and its
        ``alloc_extend`` asserts page-aligned prefixes): B chains of ``seq_pages`` whole pages prefilled in
        one batch (untimed), then ``calls`` x one ``alloc_extend`` of 1 token for each chain (each starts a
        page, on the lane the chain's rotation gives SGLang, the balanced lane cpkv), the chains' last slots
        as ``last_loc`` and, for SGLang, their rotation bases; each call's slots are freed untimed.

        Returns ``(seconds, out_cache_loc of the last call [B])``."""
        alloc, B, P = self.fresh(), seq_pages.shape[0], self.P
        kw = self.bases(B)
        pre = alloc.alloc_extend(*self.call_args([0] * B, seq_pages * P, [-1] * B), **kw)
        L0 = seq_pages * P
        last = pre.numpy()[np.cumsum(L0) - 1]
        args = self.call_args(L0, [1] * B, last)
        total, out = 0.0, None
        for _ in range(calls):
            given = self.bases(B, kw.get("rotation_bases"))
            t0 = time.perf_counter()
            out = alloc.alloc_extend(*args, **given)
            total += time.perf_counter() - t0
            alloc.free(out)
        return total, out.numpy()


# ------------------------------------------------------------------------------------ prefix cache
class _Replay:
    """Shared bookkeeping of a replay: per-step seconds and counts."""

    def __init__(self) -> None:
        self.step_s: dict[str, float] = defaultdict(float)
        self.hit_tokens = 0
        self.failed = 0

    def _time(self, step: str, t0: float) -> float:
        t1 = time.perf_counter()
        self.step_s[step] += t1 - t0
        return t1


class CpkvReplay(_Replay):
    """cpkv's ``PrefixCache`` over an ``OwnerLaneAllocator`` of ``pages`` usable pages, no host tier.

    Per request (tokens t): ``match_prefix(t[:-1])``, ``lock``, make room (C=1: evict the shortfall first,
    as SGLang does; C>1: on ``LaneExhausted`` evict the short lane and retry), ``alloc_extend``,
    ``insert(t, row)``, ``unlock``, then free the partial last page (the request is done)."""

    name = "cpkv"

    def __init__(self, cp_size: int, page_size: int, pages: int, policy: str = "balanced") -> None:
        super().__init__()
        self.alloc = CpkvAlloc(cp_size, page_size, pages, policy).fresh()
        self.cache = PrefixCache(self.alloc)
        self.P, self.C = page_size, cp_size

    def request(self, t: np.ndarray) -> None:
        P, alloc, cache = self.P, self.alloc, self.cache
        n = t.shape[0]
        t0 = time.perf_counter()
        m = cache.match_prefix(t[:-1])
        t0 = self._time("match", t0)
        cache.lock(m.handle)
        t0 = self._time("lock", t0)
        L0 = m.device_len
        if self.C == 1:
            short = -(-n // P) - L0 // P - alloc.total_free_pages
            if short > 0:
                cache.evict(0, short)
            t0 = self._time("evict", t0)
        ext = None
        for _ in range(2 * self.C + 1):
            try:
                ext = alloc.alloc_extend([L0], [n - L0], [m.last_loc])
                break
            except LaneExhausted as e:
                t0 = self._time("alloc", t0)
                if cache.evict(e.lane, e.needed - e.available) == 0:
                    break
                t0 = self._time("evict", t0)
        t0 = self._time("alloc", t0)
        if ext is None:
            self.failed += 1
            cache.unlock(m.handle)
            return
        row = np.concatenate([m.device_slots, ext.out_cache_loc.numpy()])
        cache.insert(t, row)
        t0 = self._time("insert", t0)
        cache.unlock(m.handle)
        t0 = self._time("unlock", t0)
        if n % P:
            alloc.free([int(row[-1]) // P])
        self._time("free", t0)
        self.hit_tokens += L0


class SGLangReplay(_Replay):
    """SGLang's ``RadixCache.create_simulated`` (LRU) over its allocator of ``pages`` usable pages.

    Per request, as SGLang's scheduler does: ``match_prefix`` on t[:-1], ``inc_lock_ref``, evict the page
    shortfall, ``alloc_extend``, ``insert`` the page-aligned key with the row's slots and free the
    duplicates it reports, ``dec_lock_ref``, then free the partial last page."""

    name = "sglang"

    def __init__(self, sg, page_size: int, pages: int) -> None:
        super().__init__()
        self.sg, self.P = sg, page_size
        self.alloc = SGLangAlloc(sg, page_size, pages).fresh()
        self.cache = sg.RadixCache.create_simulated(mock_allocator=self.alloc, page_size=page_size)

    def request(self, t: array) -> None:
        sg, P, alloc, cache = self.sg, self.P, self.alloc, self.cache
        n = len(t)
        t0 = time.perf_counter()
        mr = cache.match_prefix(sg.MatchPrefixParams(key=sg.RadixKey(t[:-1])))
        node, L0 = mr.last_device_node, mr.device_prefix_len
        prefix = cache.path_device_indices(node)
        t0 = self._time("match", t0)
        cache.inc_lock_ref(node)
        t0 = self._time("lock", t0)
        short = (-(-n // P) - L0 // P) * P - alloc.available_size()
        if short > 0:
            cache.evict(sg.EvictParams(num_tokens=short))
        t0 = self._time("evict", t0)
        L0t = torch.tensor([L0], dtype=torch.int64)
        seq = torch.tensor([n], dtype=torch.int64)
        last = prefix[-1:] if L0 else torch.tensor([-1], dtype=torch.int64)
        out = alloc.alloc_extend(L0t, L0t, seq, seq, last, n - L0)
        t0 = self._time("alloc", t0)
        if out is None:
            self.failed += 1
            cache.dec_lock_ref(node)
            return
        row = torch.cat([prefix, out])
        res = cache.insert(sg.InsertParams(key=sg.RadixKey(t), value=row))
        if res.prefix_len > L0:
            alloc.free(row[L0 : res.prefix_len])  # pages the tree already held: the caller's copies go back
        t0 = self._time("insert", t0)
        cache.dec_lock_ref(node)
        t0 = self._time("unlock", t0)
        if n % P:
            alloc.free(row[n // P * P :])
        self._time("free", t0)
        self.hit_tokens += L0


def reference_hit_tokens(prompts: list[np.ndarray], page_size: int) -> int:
    """Hit tokens of an unbounded page-granular prefix cache, from the token ids alone (no cache code):
    each request matches the longest run of full pages of ``t[:-1]`` seen before, then records its own."""
    seen: set[bytes] = set()
    hits = 0
    for t in prompts:
        pages = (t.shape[0] - 1) // page_size
        key, matching = b"", True
        for j in range(t.shape[0] // page_size):
            key = hash_bytes(key + t[j * page_size : (j + 1) * page_size].tobytes())
            if matching and j < pages and key in seen:
                hits += page_size
            else:
                matching = False
            seen.add(key)
    return hits


def hash_bytes(b: bytes) -> bytes:
    """A 16-byte digest standing for a whole token prefix (blake2b)."""
    import hashlib

    return hashlib.blake2b(b, digest_size=16).digest()
