"""The one-page path (decode steps, small calls; ``cpkv/allocator/one_page.py``) against the general path.

Differential: the same allocator state and call go through ``alloc_decode`` / ``alloc_extend`` (which take
the one-page path whenever every request needs at most one new page) and through the general path
(``_alloc_planned``, the extend planner) on a deep copy. Everything must be bit for bit the same:
``out_cache_loc``, ``new_pages``, every field of the plan, the allocator state afterwards, and for bad
input the error's type and message with nothing changed. Random cases cover every owner policy, both CP
strategies (C-INTERLEAVE: one new page is on the phase's lane under either),
cp_size 1..5, page sizes 1..64, lanes of unequal capacity, pages already held, fresh and continued
requests, and bad ``last_loc`` / lengths.
"""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import event, given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from allocator_state import snapshot
from cpkv import BatchPlan, CPConfig, CpkvError, OwnerLaneAllocator

pytestmark = pytest.mark.unit

POLICIES = ("rotation", "legacy", "balanced")
BAD = (
    "negative_prefix",
    "free_page",
    "inconsistent",
    "fresh_with_last",
    "missing_last",
    "out_of_range",
    "page_zero",
    "missing_page",
)


@st.composite
def scenarios(draw, decode: bool):
    """An allocator with some pages held, and a batch of 1..6 requests (some continuing held pages)."""
    C = draw(st.integers(1, 5), label="C")
    P = draw(st.sampled_from([1, 2, 3, 4, 8, 64]), label="P")
    policy = draw(st.sampled_from(POLICIES), label="policy")
    strategy = draw(st.sampled_from(["zigzag", "interleave"]), label="cp_strategy")
    caps = draw(st.lists(st.integers(1, 9), min_size=C, max_size=C), label="caps")
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy, strategy), caps)
    held = []
    for _ in range(draw(st.integers(1, 12), label="held")):
        lanes = np.flatnonzero(alloc.free_pages_per_lane()).tolist()
        if lanes:
            held += alloc.alloc_pages([draw(st.sampled_from(lanes))]).tolist()
    L0s, Es, lasts = [], [], []
    for _ in range(draw(st.integers(1, 6), label="B")):
        if held and draw(st.integers(0, 5), label="fresh") > 0:  # continue a request on a held page
            o = draw(st.integers(0, P - 1))
            L0s.append(draw(st.integers(0, 50)) * P + o + 1)
            lasts.append(draw(st.sampled_from(held)) * P + o)
        else:
            L0s.append(0)
            lasts.append(-1)
        Es.append(1 if decode else draw(st.integers(0, 2 * P - 1) | st.integers(0, 4 * P), label="E"))
    if draw(st.integers(0, 7), label="bad") == 0:  # one bad request
        i = draw(st.integers(0, len(L0s) - 1))
        kind = draw(st.sampled_from(BAD))
        free = np.flatnonzero(alloc.is_free(np.arange(alloc.num_pages))).tolist()
        if kind == "negative_prefix":
            L0s[i] = -1 - L0s[i]
        elif kind == "free_page" and free:
            L0s[i], lasts[i] = P, draw(st.sampled_from(free)) * P + P - 1
        elif kind == "inconsistent" and P > 1 and lasts[i] >= 0:
            L0s[i] += 1
        elif kind == "fresh_with_last" and held:
            L0s[i], lasts[i] = 0, held[0] * P + P - 1
        elif kind == "missing_last":
            L0s[i], lasts[i] = P, -1
        elif kind == "out_of_range":
            L0s[i], lasts[i] = P, alloc.num_pages * P + P - 1
        elif kind == "page_zero":
            L0s[i], lasts[i] = P, P - 1
        elif kind == "missing_page" and alloc.lane_pages.min() < alloc.pages_per_lane:
            r = int(np.argmin(alloc.lane_pages))
            L0s[i], lasts[i] = P, ((alloc.pages_per_lane - 1) * C + r) * P + P - 1
        event(f"bad input: {kind}")
    form = draw(st.sampled_from(["list", "numpy", "tensor"]), label="form")
    return alloc, L0s, Es, lasts, form


def as_form(values, form):
    if form == "numpy":
        return np.asarray(values, dtype=np.int64)
    if form == "tensor":
        return torch.tensor(values, dtype=torch.int64)
    return list(values)


def assert_same_plan(got: BatchPlan, want: BatchPlan, read_only: bool = True) -> None:
    # every field but the stamp (who made the plan, not what it is), and the arrays built on access
    names = [f.name for f in dataclasses.fields(BatchPlan) if f.name != "stamp"] + [
        "token_owner",
        "gather_index",
    ]
    for name in names:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
            assert not (read_only and a.flags.writeable), name
        elif dataclasses.is_dataclass(b) and not isinstance(b, CPConfig):  # TokenRuns
            for g in dataclasses.fields(b):
                x, y = getattr(a, g.name), getattr(b, g.name)
                assert x.dtype == y.dtype and np.array_equal(x, y), f"{name}.{g.name}"
        else:
            assert a == b, name


def run_both(alloc, L0s, Es, lasts, form, decode):
    """Call the public method on ``alloc`` and the general path on a copy; compare everything."""
    general = copy.deepcopy(alloc)
    before = snapshot(alloc)
    want = want_err = got = got_err = None
    args = (as_form(L0s, form), as_form(lasts, form))
    try:
        want = general._alloc_planned(L0s, [1] * len(L0s) if decode else Es, lasts)
    except CpkvError as e:
        want_err = e
    try:
        if decode:
            got = alloc.alloc_decode(*args)
        else:
            got = alloc.alloc_extend(args[0], as_form(Es, form), args[1])
    except CpkvError as e:
        got_err = e
    if want_err is not None:
        assert type(got_err) is type(want_err) and str(got_err) == str(want_err)
        assert snapshot(alloc) == before
        return None
    assert got_err is None, got_err
    assert got.out_cache_loc.dtype == torch.int64 and torch.equal(got.out_cache_loc, want.out_cache_loc)
    assert got.new_pages.dtype == np.int64 and got.new_pages.tolist() == want.new_pages.tolist()
    assert not got.new_pages.flags.writeable
    assert snapshot(alloc) == snapshot(general)
    return got, want


def expect_one_page(L0s, Es, P, decode) -> bool:
    """Whether the call is one the one-page path takes (given valid input and enough free pages)."""
    m = [-(-(L + E) // P) - -(-L // P) for L, E in zip(L0s, Es, strict=True)]
    return max(m) <= 1 and (min(L0s) >= 1 if decode else max(Es) < 2 * P)


@pytest.mark.slow
@pytest.mark.clause("C-ALLOC")
@pytest.mark.clause("C-BALANCED")
@pytest.mark.clause("C-INTERLEAVE")
@pytest.mark.parametrize("decode", [True, False], ids=["alloc_decode", "alloc_extend"])
@given(data=st.data())
@hsettings(max_examples=300, deadline=None)
def test_one_page_path_equals_general_path(decode, data):
    alloc, L0s, Es, lasts, form = data.draw(scenarios(decode))
    note(
        f"C={alloc.config.cp_size} P={alloc.config.page_size} policy={alloc.config.owner_policy} "
        f"cp_strategy={alloc.config.cp_strategy} "
        f"caps={alloc.lane_pages.tolist()} L0={L0s} E={Es} last={lasts} form={form}"
    )
    probe = copy.deepcopy(alloc)._alloc_one_page(L0s, None if decode else Es, lasts)
    both = run_both(alloc, L0s, Es, lasts, form, decode)
    if both is None:
        assert probe is None  # bad input: the general path raised
        return
    got, want = both
    if expect_one_page(L0s, Es, alloc.config.page_size, decode):
        assert probe is not None  # the case really took the one-page path
        event("one-page path")
    assert_same_plan(got.plan, want.plan)


@pytest.mark.clause("C-ALLOC")
@pytest.mark.parametrize("policy", POLICIES)
def test_decode_steps_over_many_pages_match_general_path(policy):
    # 40 requests, 36 of them at a page boundary (more new pages in one step than the Python pick takes,
    # so the vectorised pick runs), then 30 decode steps in which requests cross boundaries one by one.
    C, P = 4, 4
    alloc = OwnerLaneAllocator(CPConfig(C, P, policy), [600, 560, 640, 520])
    seq = np.where(np.arange(40) < 36, 4 * (np.arange(40) % 5 + 1), np.arange(40) % 3 + 1)
    pre = alloc.alloc_extend(np.zeros(40, np.int64), seq, np.full(40, -1)).out_cache_loc.numpy()
    last = pre[np.cumsum(seq) - 1]
    for _ in range(30):
        both = run_both(alloc, seq.tolist(), [1] * 40, last.tolist(), "numpy", decode=True)
        assert both is not None
        assert_same_plan(both[0].plan, both[1].plan)
        last = both[0].out_cache_loc.numpy()
        seq = seq + 1


@pytest.mark.clause("C-ALLOC")
def test_plan_is_the_one_of_the_call_not_of_later_state_or_inputs():
    # The one-page plan is built on first access: it must reflect the call's inputs and phases even
    # when the caller's arrays change and other allocations happen before it is read.
    C, P = 4, 4
    alloc = OwnerLaneAllocator(CPConfig(C, P, "balanced"), 8)
    general = copy.deepcopy(alloc)
    L0, E, last = np.zeros(3, np.int64), np.array([4, 1, 3]), np.full(3, -1)
    got = alloc.alloc_extend(L0, E, last)
    want = general._alloc_planned(L0.copy(), E.copy(), last.copy())
    L0[:], E[:] = 7, 9  # the caller reuses its buffers
    alloc.alloc_extend([0, 0], [4, 4], [-1, -1])  # and allocates again (balanced phases depend on state)
    assert_same_plan(got.plan, want.plan)
    assert got.plan is got.plan  # built once
    assert L0.flags.writeable and E.flags.writeable  # the caller's arrays stay the caller's


@pytest.mark.clause("C-BALANCED")
def test_spec_balanced_examples_take_the_one_page_path():
    # SPEC C-BALANCED: C=2, P=1, Q=2 (lane 0 has one usable page): two separate one-token batches get
    # pages 1 and 2. One-page requests one batch at a time go round robin 1, 2, ..., C-1, 0 (consequence b).
    alloc = OwnerLaneAllocator(CPConfig(2, 1, "balanced"), 2)
    assert copy.deepcopy(alloc)._alloc_one_page([0], [1], [-1]) is not None
    assert [alloc.alloc_extend([0], [1], [-1]).new_pages.tolist() for _ in range(2)] == [[1], [2]]
    alloc = OwnerLaneAllocator(CPConfig(4, 16, "balanced"), 64)
    lanes = [int(alloc.alloc_extend([0], [16], [-1]).new_pages[0]) % 4 for _ in range(8)]
    assert lanes == [1, 2, 3, 0, 1, 2, 3, 0]


@pytest.mark.clause("C-ALLOC")
def test_spec_decode_rule():
    # SPEC section 7: a decode token takes a new page only when its position starts a page; otherwise it
    # goes to last_loc + 1. C=4, P=4, Q=8, rotation: request A holds 5 tokens (pages [4, 1]: L0=0, E=5,
    # phase 0 -> owners [0, 1]; slots 16..19, 4), request B holds 8 tokens (next batch, phase 0 again:
    # lane 0 page 8, lane 1 page 5; slots 32..35, 20..23).
    alloc = OwnerLaneAllocator(CPConfig(4, 4, "rotation"), 8)
    assert alloc.alloc_extend([0], [5], [-1]).out_cache_loc.tolist() == [16, 17, 18, 19, 4]
    assert alloc.alloc_extend([0], [8], [-1]).out_cache_loc.tolist() == [32, 33, 34, 35, 20, 21, 22, 23]
    # Decode [A, B] at seq_lens [5, 8]: A's token 5 -> slot 5 (last_loc 4 + 1); B's token 8 starts a page:
    # phase (8 // 4 + 1) % 4 = 3 -> lane 3's first free page 3 -> slot 12.
    res = alloc.alloc_decode([5, 8], [4, 23])
    assert res.out_cache_loc.tolist() == [5, 12]
    assert res.new_pages.tolist() == [3]
    assert res.plan.page_owners.tolist() == [3] and res.plan.head_owners.tolist() == [1, -1]


def test_extend_allocation_is_read_only():
    alloc = OwnerLaneAllocator(CPConfig(2, 4), 8)
    for res in (
        alloc.alloc_extend([0], [3], [-1]),
        alloc.alloc_extend([0], [30], [-1]),
    ):  # lazy and eager plan
        with pytest.raises(AttributeError, match="read-only"):
            res.plan = None
        with pytest.raises(AttributeError, match="read-only"):
            res.out_cache_loc = None
        assert repr(res).startswith("ExtendAllocation(tokens=")


@pytest.mark.clause("C-FAIL-FAST")
@pytest.mark.parametrize("decode", [True, False], ids=["alloc_decode", "alloc_extend"])
@pytest.mark.parametrize(
    ("L0", "last", "match"),
    [
        (-4, 7, r"prefix_len=-4 must be >= 0"),
        (6, 7, r"last_loc=7 is inconsistent with prefix_len=6"),  # (7 + 1) % 4 = 0 but 6 % 4 = 2
        (8, 11, r"last_loc=11 lies on page 2, which is free"),
        (0, 7, r"prefix_len=0 needs last_loc=-1, got 7"),
        (8, -1, r"last_loc=-1 out of range \[4, 128\)"),
        (8, 131, r"last_loc=131 out of range"),
        (8, 3, r"last_loc=3 out of range \[4, 128\)"),  # page 0
        (8, 4 * 29 + 3, r"lies on page 29, which does not exist"),  # lane 1 holds 7 pages: 29 // 4 = 7
        (2**53, 4 * 1 + 3, r"exceeds 9007199254740992"),
    ],
)
def test_bad_single_request_raises_as_general_path(decode, L0, last, match):
    # C=4, P=4, lanes [8, 7, 8, 8]; page 1 (slots 4..7) is held. Each call is one request of one token
    # (E=1), so the one-page path would take it were it valid: it must leave it to the general path.
    alloc = OwnerLaneAllocator(CPConfig(4, 4, "balanced"), [8, 7, 8, 8])
    assert alloc.alloc_pages([1]).tolist() == [1]
    before = snapshot(alloc)
    assert alloc._alloc_one_page([L0], None if decode else [1], [last]) is None
    with pytest.raises(CpkvError, match=match):
        alloc.alloc_decode([L0], [last]) if decode else alloc.alloc_extend([L0], [1], [last])
    assert snapshot(alloc) == before


def test_allocation_copies_and_pickles_with_its_plan():
    # A caller that snapshots its state (copy.deepcopy, pickle across processes) may hold an allocation whose
    # plan was deferred: the copy carries the same plan, built first (numpy copies are writeable again).
    import pickle

    alloc = OwnerLaneAllocator(CPConfig(4, 4, "balanced"), 8)
    got = alloc.alloc_extend([0, 0], [4, 3], [-1, -1])
    for twin in (copy.deepcopy(got), pickle.loads(pickle.dumps(got))):
        assert twin.out_cache_loc.tolist() == got.out_cache_loc.tolist()
        assert twin.new_pages.tolist() == got.new_pages.tolist()
        assert_same_plan(twin.plan, got.plan, read_only=False)
