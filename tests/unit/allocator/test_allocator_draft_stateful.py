"""Stateful test of speculative decoding on owner lanes (SPEC C-DRAFT, C-ALLOC, C-ATOMIC).

A hypothesis state machine interleaves prefill extends, draft steps (``alloc_draft``), rollbacks after
verification (``release_tail`` with any accepted count), frees of whole requests (a request may finish
or abort with its draft still pending) and invalid rollbacks, over every owner policy and both CP
strategies (C-INTERLEAVE), cp_size 1..6,
page_size 1/2/4/8 and small, sometimes unequal lanes, so lanes run out. A plain model records, per
request, the slot of every position, its pages in position order and its pending draft. After every step:
no page is both free and held, free pages per lane match the model, and each request's per-rank KV
lengths (``rank_kv_lens``, and ``verify_rank_kv_lens`` for a pending draft) equal a position-by-position
count over its slots and sum to its length.
"""

from collections import Counter

import numpy as np
import pytest
from hypothesis import event
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import oracle
from allocator_state import snapshot
from cpkv import (
    AllocatorError,
    CPConfig,
    LaneExhausted,
    OwnerLaneAllocator,
    rank_kv_lens,
    verify_rank_kv_lens,
)

pytestmark = pytest.mark.unit


class Req:
    """One live request: the slot of every cached position, its pages in position order, a pending draft."""

    def __init__(self) -> None:
        self.slots: list[int] = []  # slot of positions 0 .. seq_len - 1
        self.pages: list[int] = []
        self.draft: tuple[int, list[int], list[int]] | None = None  # (k, draft slots, draft's new pages)

    @property
    def seq_len(self) -> int:
        return len(self.slots)

    @property
    def last_loc(self) -> int:
        return self.slots[-1] if self.slots else -1


class DraftMachine(RuleBasedStateMachine):
    @initialize(
        C=st.integers(1, 6),
        P=st.sampled_from([1, 2, 4, 8]),
        policy=st.sampled_from(oracle.POLICIES),
        strategy=st.sampled_from(oracle.STRATEGIES),
        data=st.data(),
    )
    def setup(self, C, P, policy, strategy, data):
        if data.draw(st.booleans(), label="unequal"):
            caps = data.draw(st.lists(st.integers(1, 7), min_size=C, max_size=C), label="caps")
        else:
            caps = [data.draw(st.integers(2, 7), label="Q")] * C
        self.C, self.P, self.caps = C, P, caps
        self.alloc = OwnerLaneAllocator(
            CPConfig(C, P, policy, strategy), caps if len(set(caps)) > 1 else caps[0]
        )
        self.usable = [q - (r == 0) for r, q in enumerate(caps)]
        self.reqs: dict[int, Req] = {}
        self.next_id = 0

    # -------------------------------------------------------------------------------------------- helpers
    def held(self) -> list[int]:
        return [p for q in self.reqs.values() for p in q.pages + (q.draft[2] if q.draft else [])]

    def idle(self) -> list[int]:
        return sorted(r for r, q in self.reqs.items() if q.draft is None)

    def pending(self) -> list[int]:
        return sorted(r for r, q in self.reqs.items() if q.draft is not None)

    def check_new_pages(self, before, new_pages: list[int], out: list[int], counts: list[int]) -> None:
        assert all(before[2][p] for p in new_pages) and len(set(new_pages)) == len(new_pages)
        assert len(out) == sum(counts)

    # --------------------------------------------------------------------------------------------- rules
    @rule(data=st.data())
    def extend(self, data):
        """Prefill a batch of new requests and continuations of idle ones."""
        ids = (
            data.draw(st.lists(st.sampled_from(self.idle()), unique=True, max_size=2), label="cont")
            if self.idle()
            else []
        )
        ids += [None] * data.draw(st.integers(0 if ids else 1, 2), label="new")
        Es = [data.draw(st.integers(0, 3 * self.P + 1), label="E") for _ in ids]
        reqs = [self.reqs[r] if r is not None else Req() for r in ids]
        before = snapshot(self.alloc)
        try:
            res = self.alloc.alloc_extend([q.seq_len for q in reqs], Es, [q.last_loc for q in reqs])
        except LaneExhausted:
            assert snapshot(self.alloc) == before
            return
        out, new_pages = res.out_cache_loc.tolist(), res.new_pages.tolist()
        self.check_new_pages(before, new_pages, out, Es)
        ind = res.plan.page_indptr.tolist()
        t = 0
        for i, (rid, q, E) in enumerate(zip(ids, reqs, Es, strict=True)):
            q.slots += out[t : t + E]
            q.pages += new_pages[ind[i] : ind[i + 1]]
            t += E
            if rid is None:
                self.reqs[self.next_id] = q
                self.next_id += 1

    @rule(data=st.data())
    def extend_again(self, data):
        """Same as ``extend`` (a second rule, so that an empty machine has more than one enabled rule)."""
        self.extend(data)

    @precondition(lambda self: bool(self.idle()))
    @rule(data=st.data())
    def draft(self, data):
        """A speculative step for a few idle requests: k slots each from alloc_draft, pending verification."""
        ids = data.draw(
            st.lists(st.sampled_from(self.idle()), unique=True, min_size=1, max_size=3), label="ids"
        )
        k = data.draw(st.integers(1, 2 * self.P + 1), label="k")
        reqs = [self.reqs[r] for r in ids]
        before = snapshot(self.alloc)
        try:
            res = self.alloc.alloc_draft([q.seq_len for q in reqs], [q.last_loc for q in reqs], k)
        except LaneExhausted:
            assert snapshot(self.alloc) == before  # C-ATOMIC
            event("draft: LaneExhausted")
            return
        event(f"draft: new pages {bool(res.new_pages.size)}")
        out, new_pages = res.out_cache_loc.tolist(), res.new_pages.tolist()
        self.check_new_pages(before, new_pages, out, [k] * len(ids))
        ind = res.plan.page_indptr.tolist()
        for i, q in enumerate(reqs):
            q.draft = (k, out[i * k : (i + 1) * k], new_pages[ind[i] : ind[i + 1]])
        if data.draw(st.booleans(), label="verify_now"):  # the usual MTP step: verify at once
            for rid in ids:
                self.verify(self.reqs[rid], data)

    @precondition(lambda self: bool(self.pending()))
    @rule(data=st.data())
    def rollback(self, data):
        """Verify one pending draft with any accepted count; release_tail frees the pages past new_len."""
        self.verify(self.reqs[data.draw(st.sampled_from(self.pending()), label="rid")], data)

    def verify(self, q: Req, data) -> None:
        """Keep n in [0, k] of q's draft tokens; check release_tail and update the model."""
        k, slots, new_pages = q.draft
        n = data.draw(st.integers(0, k), label="kept")
        pages = q.pages + new_pages
        keep = -(-(q.seq_len + n) // self.P)  # pages whose first position i*P < new_len
        free_before = self.alloc.free_pages_per_lane()
        freed = self.alloc.release_tail(pages, q.seq_len + n).tolist()
        assert freed == pages[keep:]
        assert set(freed) <= set(new_pages)  # the cached part is never touched
        assert self.alloc.is_free(freed).all()
        gained = Counter(oracle.lane_of(p * self.P, self.C, self.P) for p in freed)  # lanes of freed pages
        assert (self.alloc.free_pages_per_lane() - free_before).tolist() == [gained[r] for r in range(self.C)]
        event(f"rollback: freed {bool(freed)}, kept a draft page {keep > len(q.pages)}")
        q.pages, q.slots, q.draft = pages[:keep], q.slots + slots[:n], None

    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def finish(self, data):
        """A request finishes (or aborts mid-draft): every page it holds goes back, in any order."""
        rid = data.draw(st.sampled_from(sorted(self.reqs)), label="finish")
        q = self.reqs.pop(rid)
        pages = data.draw(st.permutations(q.pages + (q.draft[2] if q.draft else [])), label="order")
        self.alloc.free(pages)
        assert self.alloc.is_free(pages).all()

    @precondition(lambda self: bool(self.pending()))
    @rule(data=st.data())
    def bad_rollback(self, data):
        """An invalid release_tail: beyond the pages, negative, a free page, page 0, a duplicate, out of pool."""
        q = self.reqs[data.draw(st.sampled_from(self.pending()), label="rid")]
        pages = q.pages + q.draft[2]
        free_ids = np.flatnonzero(self.alloc.is_free(np.arange(self.alloc.num_pages))).tolist()
        cases = [
            (pages, len(pages) * self.P + 1),
            (pages, -1),
            (pages + [0], q.seq_len),
            (pages + [self.alloc.num_pages], q.seq_len),
        ]
        if pages:
            cases.append((pages + pages[-1:], q.seq_len))
        if free_ids:
            cases.append((pages + free_ids[:1], q.seq_len))
        bad_pages, new_len = data.draw(st.sampled_from(cases), label="case")
        before = snapshot(self.alloc)
        with pytest.raises(AllocatorError):
            self.alloc.release_tail(bad_pages, new_len)
        assert snapshot(self.alloc) == before

    # ---------------------------------------------------------------------------------------- invariants
    @invariant()
    def no_page_both_free_and_held(self):
        held = self.held()
        assert len(held) == len(set(held)) and 0 not in held
        is_free = self.alloc.is_free(np.arange(self.alloc.num_pages)).tolist()
        assert not any(is_free[p] for p in held)
        lanes = Counter(p % self.C for p in held)
        assert self.alloc.free_pages_per_lane().tolist() == [self.usable[r] - lanes[r] for r in range(self.C)]

    @invariant()
    def per_rank_lengths_sum_to_the_length(self):
        C, P = self.C, self.P
        cfg = CPConfig(C, P)
        for q in self.reqs.values():
            # Position t is on the request's page t // P, at the slot the allocator gave it.
            assert [s // P for s in q.slots] == [q.pages[t // P] for t in range(q.seq_len)]
            count = Counter(oracle.lane_of(s, C, P) for s in q.slots)
            lens = rank_kv_lens(q.pages, q.seq_len, cfg)
            assert lens.tolist() == [count[r] for r in range(C)] and int(lens.sum()) == q.seq_len
            if q.draft:
                k, slots, new_pages = q.draft
                rows = verify_rank_kv_lens(q.pages + new_pages, q.seq_len, k, cfg)
                for j in range(k):
                    count[oracle.lane_of(slots[j], C, P)] += 1
                    assert rows[j].tolist() == [count[r] for r in range(C)]
                    assert int(rows[j].sum()) == q.seq_len + j + 1


@pytest.mark.clause("C-DRAFT")
@pytest.mark.clause("C-ATOMIC")
def test_draft_state_machine():
    run_state_machine_as_test(
        DraftMachine, settings=hsettings(max_examples=80, stateful_step_count=30, deadline=None)
    )
