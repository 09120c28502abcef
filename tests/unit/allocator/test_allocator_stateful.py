"""Stateful and determinism tests of ``OwnerLaneAllocator`` (SPEC C-ALLOC, C-ATOMIC, C-BALANCED).

A hypothesis state machine drives realistic traffic (new requests, aligned and unaligned continuations
whose ``last_loc`` is the last slot of their previous allocation, decode steps, frees of finished
requests, raw ``alloc_pages``, deliberately too-big and invalid calls) over every owner policy, both CP
strategies (C-INTERLEAVE), cp_size 1..8, page_size 1/4/16 and a few pages per lane, so lanes run out. A
plain model (which request holds which pages) and the independent oracle (tests/oracle.py) give the
expectations; after every step the free lists are checked against the model, and every failed call must
leave the state byte-identical.
"""

import random
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import oracle
from allocator_state import snapshot
from cpkv import AllocatorError, CPConfig, LaneExhausted, OwnerLaneAllocator

pytestmark = pytest.mark.unit

POLICIES = ("rotation", "legacy", "balanced")


def expected_batch(L0s, Es, lasts, C, P, policy, free_per_lane, strategy="zigzag"):
    """Oracle plan of a batch as the allocator must make it: list of per-request oracle plans.

    Head owner = lane of ``last_loc``'s page. Under ``balanced`` each request's phase follows C-BALANCED
    (``oracle.balanced_phases``: the earlier requests' pages and transient last pages).
    """
    phases = (
        oracle.balanced_phases(L0s, Es, C, P, list(free_per_lane), strategy) if policy == "balanced" else None
    )
    plans = []
    for i, (L0, E, last) in enumerate(zip(L0s, Es, lasts, strict=True)):
        head = (last // P) % C if L0 > 0 else None
        phase = phases[i] if phases else None
        plans.append(oracle.plan_request(L0, E, C, P, i, head, phase, policy, strategy))
    return plans


def lane_needs(plans, C):
    need = [0] * C
    for plan in plans:
        for r in plan["page_owners"]:
            need[r] += 1
    return need


class Req:
    """Model of one live request: tokens cached, slot of the last one, pages held in position order."""

    def __init__(self) -> None:
        self.seq_len = 0
        self.last_loc = -1
        self.pages: list[int] = []


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(
        C=st.integers(1, 8),
        P=st.sampled_from([1, 4, 16]),
        policy=st.sampled_from(POLICIES),
        strategy=st.sampled_from(("zigzag", "interleave")),
        data=st.data(),
    )
    def setup(self, C, P, policy, strategy, data):
        if data.draw(st.booleans(), label="unequal"):
            caps = data.draw(st.lists(st.integers(1, 6), min_size=C, max_size=C), label="caps")
        else:
            caps = [data.draw(st.integers(2, 6), label="Q")] * C
        self.C, self.P, self.policy, self.strategy = C, P, policy, strategy
        self.caps = caps
        self.alloc = OwnerLaneAllocator(
            CPConfig(C, P, policy, strategy), caps if len(set(caps)) > 1 else caps[0]
        )
        self.usable = [q - (1 if r == 0 else 0) for r, q in enumerate(caps)]
        self.reqs: dict[int, Req] = {}
        self.raw: list[int] = []
        self.next_id = 0

    # ------------------------------------------------------------------------------------------ helpers
    def held_pages(self) -> list[int]:
        pages = [p for req in self.reqs.values() for p in req.pages]
        return pages + self.raw

    def model_free(self) -> list[int]:
        held = Counter(p % self.C for p in self.held_pages())
        return [self.usable[r] - held[r] for r in range(self.C)]

    def draw_extend_len(self, data) -> int:
        P = self.P
        # 0 sometimes; a few tokens (stays inside a page when P > 1); up to ~3 pages; just around a page.
        return data.draw(
            st.one_of(st.just(0), st.integers(1, 3), st.integers(1, 3 * P + 1), st.integers(P - 1, P + 1)),
            label="E",
        )

    def run_batch(self, ids, L0s, Es, lasts, decode: bool):
        """Call alloc_extend / alloc_decode and check it against the model and the oracle."""
        C, P = self.C, self.P
        before = snapshot(self.alloc)
        free_before = self.model_free()
        plans = expected_batch(L0s, Es, lasts, C, P, self.policy, free_before, self.strategy)
        need = lane_needs(plans, C)
        short = [r for r in range(C) if need[r] > free_before[r]]
        if not decode:  # plan, then commit: plan_extend is the plan alloc_extend will use, and takes nothing
            preview = self.alloc.plan_extend(L0s, Es, lasts)
            assert snapshot(self.alloc) == before
            assert preview.request_phases.tolist() == [p["phase"] for p in plans]
            assert preview.page_owners.tolist() == [r for p in plans for r in p["page_owners"]]
        try:
            if decode:
                res = self.alloc.alloc_decode(L0s, lasts)
            else:
                res = self.alloc.alloc_extend(L0s, Es, lasts)
        except LaneExhausted as e:
            assert short, f"LaneExhausted {e} but the model has room: need {need}, free {free_before}"
            assert e.lane in short
            assert (e.needed, e.available) == (need[e.lane], free_before[e.lane])
            assert snapshot(self.alloc) == before  # C-ATOMIC
            return
        assert not short, f"allocated although lanes {short} are short: need {need}, free {free_before}"
        plan = res.plan
        new_pages = res.new_pages.tolist()
        out = res.out_cache_loc.tolist()
        # Plan = oracle plan (phases, owners, owner == compute per token).
        assert plan.request_phases.tolist() == [p["phase"] for p in plans]
        assert plan.page_owners.tolist() == [r for p in plans for r in p["page_owners"]]
        assert plan.token_owner.tolist() == [r for p in plans for r in p["token_owner"]]
        # Every new page is on its planned owner lane and was free before the call.
        assert (res.new_pages % C).tolist() == plan.page_owners.tolist()
        assert all(before[2][p] for p in new_pages)
        assert len(set(new_pages)) == len(new_pages)
        assert res.out_cache_loc.dtype == torch.int64
        # owner == compute: the token's owner is the lane of its slot's page.
        assert [(s // P) % C for s in out] == plan.token_owner.tolist()
        assert len(out) == sum(Es)
        t = k = 0
        for rid, L0, E, last, p in zip(ids, L0s, Es, lasts, plans, strict=True):
            m = len(p["page_owners"])
            mine_pages = new_pages[k : k + m]
            mine = out[t : t + E]
            assert mine == oracle.out_cache_loc(L0, E, last, mine_pages, P)
            req = self.reqs[rid]
            h = p["head_tokens"]
            for s in mine[:h]:  # head slots: in the request's last prefix page
                assert s // P == req.pages[-1] == last // P
            for s in mine[h:]:  # other slots: in the request's own new pages
                assert s // P in mine_pages
            req.pages.extend(mine_pages)
            req.seq_len += E
            if E:
                req.last_loc = mine[-1]
            t += E
            k += m
        assert k == len(new_pages)

    def new_req(self) -> int:
        rid = self.next_id
        self.next_id += 1
        self.reqs[rid] = Req()
        return rid

    # -------------------------------------------------------------------------------------------- rules
    @rule(data=st.data())
    def extend(self, data):
        """A batch of 1..4 requests: new ones (L0=0) and continuations of live requests."""
        live = sorted(self.reqs)
        n = data.draw(st.integers(1, 4), label="batch")
        cont = (
            data.draw(st.lists(st.sampled_from(live), unique=True, max_size=n), label="cont") if live else []
        )
        ids = list(cont) + [None] * (n - len(cont))
        ids = data.draw(st.permutations(ids), label="order")
        fresh = []
        for j, rid in enumerate(ids):
            if rid is None:
                ids[j] = self.new_req()
                fresh.append(ids[j])
        Es = [self.draw_extend_len(data) for _ in ids]
        L0s = [self.reqs[r].seq_len for r in ids]
        lasts = [self.reqs[r].last_loc for r in ids]
        self.run_batch(ids, L0s, Es, lasts, decode=False)
        for rid in fresh:  # a new request whose allocation failed never existed
            if not self.reqs[rid].pages and self.reqs[rid].seq_len == 0:
                del self.reqs[rid]

    @rule(data=st.data())
    def extend_again(self, data):
        """Same as ``extend`` (a second rule, so that prefill traffic is the most frequent step)."""
        self.extend(data)

    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def decode(self, data):
        """One decode token for each of a few live requests (a page only at a page start)."""
        ids = data.draw(st.lists(st.sampled_from(sorted(self.reqs)), unique=True, min_size=1, max_size=4))
        L0s = [self.reqs[r].seq_len for r in ids]
        lasts = [self.reqs[r].last_loc for r in ids]
        self.run_batch(ids, L0s, [1] * len(ids), lasts, decode=True)

    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def finish(self, data):
        """A request finishes: all its pages go back, in any order."""
        rid = data.draw(st.sampled_from(sorted(self.reqs)), label="finish")
        pages = data.draw(st.permutations(self.reqs[rid].pages), label="pages")
        free_before = self.alloc.free_pages_per_lane()
        self.alloc.free(np.asarray(pages, dtype=np.int64))
        del self.reqs[rid]
        gained = np.bincount(np.asarray(pages, dtype=np.int64) % self.C, minlength=self.C)
        assert (self.alloc.free_pages_per_lane() - free_before).tolist() == gained.tolist()
        assert self.alloc.is_free(pages).all()

    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def finish_again(self, data):
        """Same as ``finish`` (a second rule, so that full pools drain as often as they fill)."""
        self.finish(data)

    @rule(owners=st.lists(st.integers(0, 7), max_size=5))
    def raw_pages(self, owners):
        """alloc_pages: one page per requested lane, in order, or LaneExhausted and no change."""
        owners = [r % self.C for r in owners]
        before = snapshot(self.alloc)
        free_before = self.model_free()
        need = Counter(owners)
        short = [r for r in range(self.C) if need[r] > free_before[r]]
        try:
            pages = self.alloc.alloc_pages(owners)
        except LaneExhausted as e:
            assert e.lane in short and (e.needed, e.available) == (need[e.lane], free_before[e.lane])
            assert snapshot(self.alloc) == before
            return
        assert not short
        assert (pages % self.C).tolist() == owners
        assert all(before[2][p] for p in pages.tolist())
        self.raw.extend(pages.tolist())

    @precondition(lambda self: bool(self.raw))
    @rule(data=st.data())
    def free_raw(self, data):
        pages = data.draw(st.lists(st.sampled_from(self.raw), unique=True, min_size=1), label="raw")
        self.alloc.free(pages)
        self.raw = [p for p in self.raw if p not in pages]

    @rule(data=st.data())
    def failing_call(self, data):
        """A deliberately failing call: too big, a bad free or an inconsistent last_loc; nothing changes."""
        kind = data.draw(st.sampled_from(["too_big", "bad_free", "bad_last_loc"]), label="kind")
        getattr(self, kind)(data)

    def too_big(self, data):
        """A batch whose last request needs 2*max(Q) pages on every lane: always LaneExhausted, no change."""
        C, P = self.C, self.P
        huge = 2 * C * max(self.caps) * P  # m = 2C*Qmax pages -> 2*Qmax on every lane > any capacity
        ids, L0s, Es, lasts = [], [], [], []
        if self.reqs and data.draw(st.booleans(), label="with_valid"):
            rid = data.draw(st.sampled_from(sorted(self.reqs)))
            ids.append(rid)
            L0s.append(self.reqs[rid].seq_len)
            Es.append(self.draw_extend_len(data))
            lasts.append(self.reqs[rid].last_loc)
        rid = self.new_req()
        ids.append(rid)
        L0s.append(0)
        Es.append(huge)
        lasts.append(-1)
        before = snapshot(self.alloc)
        with pytest.raises(LaneExhausted) as info:
            self.alloc.alloc_extend(L0s, Es, lasts)
        assert info.value.needed > info.value.available
        assert snapshot(self.alloc) == before
        del self.reqs[rid]

    def bad_free(self, data):
        """Freeing page 0, a free page, an out-of-range id or a duplicate: AllocatorError, no change."""
        N = self.alloc.num_pages
        held = self.held_pages()
        free_ids = np.flatnonzero(self.alloc.is_free(np.arange(N))).tolist()
        choices = [[0], [N], [-1]]
        if free_ids:
            choices.append([data.draw(st.sampled_from(free_ids), label="free_id")])
        if held:
            p = data.draw(st.sampled_from(held), label="held_id")
            choices += [[p, p], [p, 0]] + ([[p, free_ids[0]]] if free_ids else [])
        pages = data.draw(st.sampled_from(choices), label="bad")
        before = snapshot(self.alloc)
        with pytest.raises(AllocatorError):
            self.alloc.free(pages)
        assert snapshot(self.alloc) == before

    def bad_last_loc(self, data):
        """A continuation whose last_loc is off by one (inconsistent with prefix_len): error, no change."""
        live = sorted(r for r, q in self.reqs.items() if q.seq_len > 0)
        if self.P == 1 or not live:
            return  # every last_loc is consistent when P == 1
        req = self.reqs[data.draw(st.sampled_from(live), label="bad_req")]
        before = snapshot(self.alloc)
        with pytest.raises(AllocatorError, match=f"request 0: last_loc={req.last_loc - 1}"):
            self.alloc.alloc_extend([req.seq_len], [1], [req.last_loc - 1])
        assert snapshot(self.alloc) == before

    # --------------------------------------------------------------------------------------- invariants
    @invariant()
    def free_plus_used_is_capacity(self):
        assert self.alloc.free_pages_per_lane().tolist() == self.model_free()
        held = Counter(p % self.C for p in self.held_pages())
        assert self.alloc.used_pages_per_lane().tolist() == [held[r] for r in range(self.C)]
        assert self.alloc.total_free_pages == sum(self.model_free())

    @invariant()
    def no_page_in_two_places(self):
        held = self.held_pages()
        assert len(held) == len(set(held)), "a page is held twice"
        assert 0 not in held
        N = self.alloc.num_pages
        is_free = self.alloc.is_free(np.arange(N)).tolist()
        assert not any(is_free[p] for p in held), "a held page is also free"
        # Every page that exists (local index < Q_r, not page 0) is either free or held, never both.
        held_set = set(held)
        for p in range(N):
            exists = p != 0 and p // self.C < self.caps[p % self.C]
            assert is_free[p] == (exists and p not in held_set), p


TestAllocatorStateMachine = pytest.mark.slow(
    pytest.mark.clause("C-ALLOC")(
        pytest.mark.clause("C-ATOMIC")(pytest.mark.clause("C-BALANCED")(AllocatorMachine.TestCase))
    )
)
TestAllocatorStateMachine.settings = hsettings(max_examples=50, stateful_step_count=30, deadline=None)


# ----------------------------------------------------------------------------------------------------
# determinism: every rank replays the same decisions
# ----------------------------------------------------------------------------------------------------


def drive(allocs, rng: random.Random, C: int, P: int, Q: int, steps: int) -> list:
    """Feed the same random, realistic call sequence to every allocator; return the per-step results."""
    reqs: dict[int, list] = {}  # id -> [seq_len, last_loc, pages]
    next_id = 0
    log = []
    for _ in range(steps):
        kind = rng.choice(["extend", "extend", "decode", "finish", "finish", "huge"])
        if kind == "finish" and reqs:
            rid = rng.choice(sorted(reqs))
            pages = reqs.pop(rid)[2]
            rng.shuffle(pages)
            for a in allocs:
                a.free(pages)
            log.append(("free", [a.state_digest() for a in allocs]))
            continue
        ids = rng.sample(sorted(reqs), k=min(len(reqs), rng.randint(0, 3)))
        if kind in ("extend", "huge") or not ids:
            ids += [None] * rng.randint(1, 2)
            rng.shuffle(ids)
        L0s = [reqs[r][0] if r is not None else 0 for r in ids]
        lasts = [reqs[r][1] if r is not None else -1 for r in ids]
        if kind == "decode":
            Es = [1] * len(ids)
        else:
            Es = [rng.randint(0, 3 * P + 1) for _ in ids]
        if kind == "huge":
            Es[-1] = 2 * C * Q * P
        results = []
        for a in allocs:
            try:
                res = a.alloc_extend(L0s, Es, lasts)
            except LaneExhausted as e:
                results.append(("exhausted", e.lane, e.needed, e.available, a.state_digest()))
            else:
                results.append(
                    (
                        "ok",
                        res.new_pages.tolist(),
                        res.out_cache_loc.tolist(),
                        res.plan.request_phases.tolist(),
                        a.state_digest(),
                    )
                )
        log.append(results)
        if results[0][0] == "ok":
            pages, out = results[0][1], results[0][2]
            k = t = 0
            for rid, L0, E in zip(ids, L0s, Es, strict=True):
                m = -(-(L0 + E) // P) - -(-L0 // P)
                if rid is None:
                    rid = next_id
                    next_id += 1
                    reqs[rid] = [0, -1, []]
                reqs[rid][0] += E
                reqs[rid][2] += pages[k : k + m]
                if E:
                    reqs[rid][1] = out[t + E - 1]
                k += m
                t += E
    return log


@pytest.mark.slow
@pytest.mark.clause("C-ALLOC")
@given(
    seed=st.integers(0, 2**32 - 1),
    C=st.integers(1, 8),
    P=st.sampled_from([1, 4, 16]),
    Q=st.integers(2, 8),
    policy=st.sampled_from(POLICIES),
)
@hsettings(max_examples=40, deadline=None)
def test_same_call_sequence_gives_same_results(seed, C, P, Q, policy):
    allocs = [OwnerLaneAllocator(CPConfig(C, P, policy), Q) for _ in range(2)]
    log = drive(allocs, random.Random(seed), C, P, Q, steps=40)
    for step in log:
        if step[0] == "free":
            assert step[1][0] == step[1][1]
        else:
            assert step[0] == step[1]
    assert allocs[0].state_digest() == allocs[1].state_digest()
    assert allocs[0].free_pages_per_lane().tolist() == allocs[1].free_pages_per_lane().tolist()
    assert (
        allocs[0].pool.is_held(np.arange(allocs[0].num_pages)).tolist()
        == allocs[1].pool.is_held(np.arange(allocs[1].num_pages)).tolist()
    )
