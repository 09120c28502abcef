"""Random SGLang allocator calls, replayable on several allocators side by side.

A ``Workload`` draws operations from the request lengths alone (which every allocator under test agrees
on while their ``None`` cases agree): extend batches (unaligned prefixes, empty extends), decode batches,
``alloc`` of whole pages, frees of whole rows, page-aligned ``free_segment`` of a row's tail, and free
groups of several frees. A ``Side`` holds one allocator and each request's row (the slot of every
position, as SGLang's ``req_to_token`` would) and applies an operation with SGLang's own argument
conventions (``last_loc`` read from the row, ``seq_lens`` counting the new tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


def i64(values) -> torch.Tensor:
    """An int64 CPU tensor, as SGLang's scheduler builds its ``*_cpu`` tensors."""
    return torch.tensor(list(values), dtype=torch.int64)


@dataclass
class Side:
    """One allocator and the rows of the requests it serves (request id -> slots of positions 0..len-1)."""

    alloc: object
    rows: dict[int, list[int]] = field(default_factory=dict)

    def apply(self, op: tuple) -> list[list[int]] | None:
        """Run one operation; returns each request's new slots (None when the allocator returned None)."""
        kind = op[0]
        if kind == "extend":
            return self._extend(op[1])
        if kind == "decode":
            return self._decode(op[1])
        if kind == "alloc":
            out = self.alloc.alloc(op[2])
            if out is None:
                return None
            self.rows[op[1]] = out.tolist()
            return [out.tolist()]
        if kind == "group":
            self.alloc.free_group_begin()
            for sub in op[1]:
                self.apply(sub)
            self.alloc.free_group_end()
            return []
        if kind == "free":
            self.alloc.free(i64(self.rows.pop(op[1])))
            return []
        if kind == "truncate":  # free positions keep.. of a row, keep page-aligned (SGLang's free_segment)
            rid, keep = op[1], op[2]
            row = self.rows[rid]
            self.alloc.free_segment(i64(row[keep:]), start_pos=keep)
            self.rows[rid] = row[:keep]
            return []
        raise ValueError(f"unknown operation {kind!r}")

    def _extend(self, batch: list[tuple[int, int]]) -> list[list[int]] | None:
        prefix = [len(self.rows.get(rid, [])) for rid, _ in batch]
        seq = [p + e for p, (_, e) in zip(prefix, batch, strict=True)]
        last = [self.rows[rid][-1] if p else -1 for p, (rid, _) in zip(prefix, batch, strict=True)]
        out = self.alloc.alloc_extend(
            i64(prefix), i64(prefix), i64(seq), i64(seq), i64(last), sum(seq) - sum(prefix)
        )
        if out is None:
            return None
        parts, at = [], 0
        for rid, e in batch:
            parts.append(out[at : at + e].tolist())
            self.rows.setdefault(rid, []).extend(parts[-1])
            at += e
        return parts

    def _decode(self, rids: list[int]) -> list[list[int]] | None:
        seq = [len(self.rows[rid]) + 1 for rid in rids]
        out = self.alloc.alloc_decode(i64(seq), i64(seq), i64(self.rows[rid][-1] for rid in rids))
        if out is None:
            return None
        for rid, slot in zip(rids, out.tolist(), strict=True):
            self.rows[rid].append(slot)
        return [[s] for s in out.tolist()]

    def live_slots(self) -> np.ndarray:
        """Every slot some request holds, int64 (rows concatenated)."""
        return np.asarray([s for row in self.rows.values() for s in row], dtype=np.int64)


class Workload:
    """Draws operations (tuples, see ``Side.apply``) from the request lengths, with a seeded generator."""

    def __init__(self, seed: int, page_size: int, max_extend: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.P = page_size
        self.max_extend = max_extend
        self.lens: dict[int, int] = {}
        self.next_rid = 0

    def draw(self) -> tuple:
        """One operation; call ``commit`` with its outcome before drawing the next."""
        r, live = self.rng.random(), sorted(self.lens)
        if r < 0.40 or not live:
            B = int(self.rng.integers(1, 5))
            batch = []
            for _ in range(B):
                if live and self.rng.random() < 0.6:
                    rid = int(live.pop(int(self.rng.integers(len(live)))))
                else:
                    rid, self.next_rid = self.next_rid, self.next_rid + 1
                extend = int(self.rng.integers(0, self.max_extend + 1)) if self.rng.random() < 0.95 else 0
                batch.append((rid, extend))
            return ("extend", batch)
        with_tokens = [rid for rid in live if self.lens[rid] > 0]
        if r < 0.65 and with_tokens:
            k = int(self.rng.integers(1, min(len(with_tokens), 6) + 1))
            return ("decode", [int(x) for x in self.rng.choice(with_tokens, size=k, replace=False)])
        if r < 0.75:
            rid, self.next_rid = self.next_rid, self.next_rid + 1
            return ("alloc", rid, int(self.rng.integers(0, 3 * self.P + 1)))
        if r < 0.88:
            return self._free_op(live)
        k = int(self.rng.integers(1, min(len(live), 3) + 1))
        picks = [int(x) for x in self.rng.choice(live, size=k, replace=False)]
        return ("group", [self._free_op([rid]) for rid in picks])

    def _free_op(self, live: list[int]) -> tuple:
        rid = int(live[int(self.rng.integers(len(live)))])
        n = self.lens[rid]
        if n > self.P and self.rng.random() < 0.5:
            return ("truncate", rid, int(self.rng.integers(1, (n - 1) // self.P + 1)) * self.P)
        return ("free", rid)

    def commit(self, op: tuple, result) -> None:
        """Update the lengths after an operation (a None result changes nothing)."""
        if result is None:
            return
        kind = op[0]
        if kind == "extend":
            for rid, e in op[1]:
                self.lens[rid] = self.lens.get(rid, 0) + e
        elif kind == "decode":
            for rid in op[1]:
                self.lens[rid] += 1
        elif kind == "alloc":
            self.lens[op[1]] = op[2] // self.P * self.P
        elif kind == "group":
            for sub in op[1]:
                self.commit(sub, [])
        elif kind == "free":
            del self.lens[op[1]]
        elif kind == "truncate":
            self.lens[op[1]] = op[2]

    @staticmethod
    def frees(op: tuple) -> bool:
        """Whether the operation gives pages back."""
        return op[0] in ("free", "truncate", "group")
