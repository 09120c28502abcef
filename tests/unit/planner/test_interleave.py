"""C-INTERLEAVE (SPEC section 18): the ``interleave`` CP strategy, new page k of a request on lane
``(phase + k) % C``.

The SPEC examples, on the production planner and on the independent oracle (arithmetic in comments);
``cp_strategy`` and ``CPKV_CP_STRATEGY``; invariants of the rule checked without the oracle (round robin,
per-lane counts, m <= C gives zigzag's owners); the balanced phase counted by the rule; the allocator's
general and one-page paths, the estimate and the gather-back under it. The clause-by-clause properties under
both strategies are in the files of each clause (test_planner_properties.py, allocator/, kernels/).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import ConfigError, CPConfig, OwnerLaneAllocator, mqa_logits_elements, plan_batch, plan_request
from cpkv.policy import balanced_phase, lane_pages

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-INTERLEAVE")]


def interleave(C: int, P: int, policy: str = "rotation") -> CPConfig:
    return CPConfig(C, P, policy, "interleave")


# ----------------------------------------------------------------------------------------------------
# the SPEC section 18 examples
# ----------------------------------------------------------------------------------------------------

SPEC_EXAMPLES = [
    # (C, P, L0, E, i, head owner) -> (phase, head tokens, page owners, per_rank_tokens, last token's owner)
    # L0=0, E=1000: m = 16 pages, page k on lane k % 4; pages 0..14 full, page 15 (lane 3) 1000 - 960 = 40
    # tokens: lanes 0..2 hold 4 full pages = 256, lane 3 three full and the 40 = 232.
    ((4, 64, 0, 1000, 0, None), (0, 0, [0, 1, 2, 3] * 4, [256, 256, 256, 232], 3)),
    # i=1: phase (0 + 1) % 4 = 1, page k on lane (1 + k) % 4; the 40-token page 15 on lane (1 + 15) % 4 = 0.
    ((4, 64, 0, 1000, 1, None), (1, 0, [1, 2, 3, 0] * 4, [232, 256, 256, 256], 0)),
    # L0=100: phase (100 // 64) % 4 = 1; h = 64 - 36 = 28 head tokens on the head owner 1; m = 5 - 2 = 3
    # pages on lanes 1, 2, 3 (m <= C: zigzag's owners too): per rank [0, 28 + 64, 64, 300 - 256 = 44].
    ((4, 64, 100, 200, 0, 1), (1, 28, [1, 2, 3], [0, 92, 64, 44], 3)),
    # C=2, P=1: five one-token pages on lanes 0, 1, 0, 1, 0.
    ((2, 1, 0, 5, 0, None), (0, 0, [0, 1, 0, 1, 0], [3, 2], 0)),
]


@pytest.mark.parametrize(("args", "want"), SPEC_EXAMPLES)
def test_spec_examples_production(args, want):
    C, P, L0, E, i, head = args
    got = plan_request(L0, E, interleave(C, P), req_index=i, head_owner=head)
    phase, h, owners, per_rank, last = want
    assert (got.phase, got.head_tokens, got.last_token_owner) == (phase, h, last)
    assert got.page_owners.dtype == np.int64 and got.page_owners.tolist() == owners
    assert got.per_rank_tokens.tolist() == per_rank
    # C-OWNER-EQ-COMPUTE: every token on its page's owner, the head tokens on the head owner.
    first_new = -(-L0 // P)
    pos = L0 + np.arange(E)
    want_owner = [head if p // P < first_new else owners[p // P - first_new] for p in pos.tolist()]
    assert got.token_owner.tolist() == want_owner


@pytest.mark.parametrize(("args", "want"), SPEC_EXAMPLES)
def test_spec_examples_oracle(args, want):
    C, P, L0, E, i, head = args
    plan = oracle.plan_request(L0, E, C, P, i, head_owner=head, strategy="interleave")
    phase, h, owners, per_rank, last = want
    assert (plan["phase"], plan["head_tokens"], plan["last_token_owner"]) == (phase, h, last)
    assert plan["page_owners"] == owners
    assert plan["per_rank_tokens"] == per_rank


def test_spec_example_batch_of_two_is_the_two_requests():
    # The first two examples as one batch (C-BATCH): request 1 sits at req_index 1, so phase 1.
    plan = plan_batch([0, 0], [1000, 1000], interleave(4, 64))
    assert plan.request_phases.tolist() == [0, 1]
    assert plan.page_owners.tolist() == [0, 1, 2, 3] * 4 + [1, 2, 3, 0] * 4
    assert plan.per_rank_tokens.tolist() == [256 + 232, 256 + 256, 256 + 256, 232 + 256]
    assert plan.last_token_owner.tolist() == [3, 0]
    assert plan.max_rank_tokens == 512


# ----------------------------------------------------------------------------------------------------
# cp_strategy and CPKV_CP_STRATEGY
# ----------------------------------------------------------------------------------------------------


def test_default_is_zigzag_and_the_env_var_is_read_once(monkeypatch):
    monkeypatch.delenv("CPKV_CP_STRATEGY", raising=False)
    assert CPConfig(4, 64).cp_strategy == "zigzag"
    monkeypatch.setenv("CPKV_CP_STRATEGY", " Interleave ")
    cfg = CPConfig(4, 64, "rotation")
    assert cfg.cp_strategy == "interleave"
    monkeypatch.setenv("CPKV_CP_STRATEGY", "")
    assert CPConfig(4, 64).cp_strategy == "zigzag"  # empty: the default
    assert cfg.cp_strategy == "interleave"  # resolved at construction, not on each read
    assert plan_request(0, 1000, cfg).page_owners.tolist() == [0, 1, 2, 3] * 4
    assert CPConfig(4, 64, cp_strategy="zigzag").cp_strategy == "zigzag"  # the argument wins over the env


@pytest.mark.parametrize("bad", ["roundrobin", "Interleave", "", 3])
def test_bad_strategy_argument_names_it(bad):
    with pytest.raises(ConfigError, match="cp_strategy") as err:
        CPConfig(4, 64, "rotation", bad)
    assert repr(bad) in str(err.value) and "zigzag, interleave" in str(err.value)


def test_bad_strategy_env_var_names_the_variable(monkeypatch):
    monkeypatch.setenv("CPKV_CP_STRATEGY", "ring")
    with pytest.raises(ConfigError, match="CPKV_CP_STRATEGY='ring'"):
        CPConfig(4, 64)


# ----------------------------------------------------------------------------------------------------
# the rule, checked without the oracle
# ----------------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    C=st.integers(1, 12),
    P=st.sampled_from([1, 3, 16, 64]),
    L0=st.integers(0, 400),
    E=st.integers(0, 900),
    data=st.data(),
)
def test_round_robin_counts_and_small_requests_match_zigzag(C, P, L0, E, data):
    f = data.draw(st.integers(0, C - 1), label="phase")
    got = plan_request(L0, E, interleave(C, P), head_owner=0, phase=f)
    m = got.num_new_pages
    assert got.page_owners.tolist() == [(f + k) % C for k in range(m)]
    counts = np.bincount(got.page_owners, minlength=C)
    assert lane_pages(m, f, C, "interleave").tolist() == counts.tolist()
    assert set(counts.tolist()) <= {m // C, -(-m // C)}  # every lane m // C or one more
    zig = plan_request(L0, E, CPConfig(C, P, "rotation", "zigzag"), head_owner=0, phase=f)
    if m <= C:  # SPEC: for m <= C both strategies give the same owners
        assert zig.page_owners.tolist() == got.page_owners.tolist()
        assert zig.token_owner.tolist() == got.token_owner.tolist()
    assert zig.per_rank_tokens.sum() == got.per_rank_tokens.sum() == E
    # Each rank's runs: the position runs of one owner are single pages (C > 1), so about m / C per rank.
    owner, a, b = got.position_runs()
    if C > 1 and m:
        assert ((b - a) <= 2 * P - 1).all()  # a page, or the head run merged with page 0 on one lane
        assert owner.shape[0] == m + (got.head_tokens > 0) - (got.head_tokens > 0 and got.head_owner == f)


def test_lane_pages_example():
    # m=6, C=4, phase 3: pages on lanes 3, 0, 1, 2, 3, 0.
    assert lane_pages(6, 3, 4, "interleave").tolist() == [2, 1, 1, 2]
    assert lane_pages(6, 3, 4).tolist() == lane_pages(6, 3, 4, "zigzag").tolist()


# ----------------------------------------------------------------------------------------------------
# C-BALANCED counted by the interleave rule
# ----------------------------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None)
@given(C=st.integers(1, 12), m=st.integers(1, 60), partial=st.booleans(), data=st.data())
def test_window_rule_equals_the_criteria_counted_by_interleave(C, m, partial, data):
    """``policy.balanced_phase(..., interleave=True)`` picks the phase ``oracle.balanced_phase`` picks by brute
    force with the interleave rule, and lowers ``free`` / raises ``transient`` by that phase's pages."""
    P = 4
    free = data.draw(st.lists(st.integers(-1, 5), min_size=C, max_size=C), label="free")
    transient = data.draw(st.lists(st.integers(0, 2), min_size=C, max_size=C), label="transient")
    rotation = data.draw(st.integers(0, C - 1), label="rotation")
    E = m * P - (1 if partial else 0)
    want = oracle.balanced_phase(0, E, C, P, rotation, free, transient, strategy="interleave")
    left, trans = list(free), list(transient)
    assert balanced_phase(left, trans, m, rotation, partial, interleave=True) == want
    owners = oracle.plan_request(0, E, C, P, rotation, phase=want, strategy="interleave")["page_owners"]
    assert left == [free[r] - owners.count(r) for r in range(C)]
    assert trans == [transient[r] + (partial and owners[-1] == r) for r in range(C)]


def test_balanced_interleave_hand_computed():
    # C=4, P=1, lanes of 8 pages (lane 0: 7, page 0 reserved), one 6-token prompt: interleave puts 2 pages on
    # the phase's lane and the next, 1 on the other two. Free [7, 8, 8, 8]: phase 1 (lanes 1, 2 take two) keeps
    # min(free - n) = 6 on every lane; phase 0 would leave lane 0 at 5. Rotation phase 0, so 1 is the nearest.
    alloc = OwnerLaneAllocator(CPConfig(4, 1, "balanced", "interleave"), 8)
    res = alloc.alloc_extend([0], [6], [-1])
    assert res.plan.request_phases.tolist() == [1]
    assert res.plan.page_owners.tolist() == [1, 2, 3, 0, 1, 2]
    assert alloc.free_pages_per_lane().tolist() == [6, 6, 6, 7]
    # Under zigzag (one-page segments on ranks 0,1,2,3,3,2: two on ranks 2, 3) phases 0 and 3 tie: phase 0.
    zig = OwnerLaneAllocator(CPConfig(4, 1, "balanced", "zigzag"), 8)
    assert zig.alloc_extend([0], [6], [-1]).plan.request_phases.tolist() == [0]


@settings(max_examples=100, deadline=None)
@given(C=st.integers(1, 8), P=st.sampled_from([1, 4, 16]), data=st.data())
def test_allocator_phases_equal_the_oracle_rule(C, P, data):
    caps = data.draw(st.lists(st.integers(2, 12), min_size=C, max_size=C), label="caps")
    alloc = OwnerLaneAllocator(CPConfig(C, P, "balanced", "interleave"), caps)
    for r in data.draw(st.lists(st.integers(0, C - 1), max_size=8), label="warm"):
        if alloc.free_pages_per_lane()[r] > 1:
            alloc.alloc_pages([r])
    B = data.draw(st.integers(1, 5), label="B")
    Es = [data.draw(st.integers(0, 4 * C * P), label="E") for _ in range(B)]
    free = alloc.free_pages_per_lane().tolist()
    plan = alloc.plan_extend([0] * B, Es, [-1] * B)
    assert plan.request_phases.tolist() == oracle.balanced_phases([0] * B, Es, C, P, free, "interleave")


# ----------------------------------------------------------------------------------------------------
# allocator, estimate, gather-back
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-ALLOC")
def test_fresh_allocation_follows_the_lanes():
    # C=4, P=64, Q=8, one request L0=0, E=1000 under rotation: page k on lane k % 4; a fresh allocator hands
    # out each lane's lowest free pages: lane 0 -> 4, 8, 12, 16 (page 0 reserved), lane 1 -> 1, 5, 9, 13, ...
    alloc = OwnerLaneAllocator(interleave(4, 64), 8)
    res = alloc.alloc_extend([0], [1000], [-1])
    assert res.new_pages.tolist() == [4, 1, 2, 3, 8, 5, 6, 7, 12, 9, 10, 11, 16, 13, 14, 15]
    assert res.new_pages.tolist() == oracle.fresh_alloc_pages(res.plan.page_owners.tolist(), 4, 8)
    slots = res.out_cache_loc.numpy()
    assert slots[:3].tolist() == [256, 257, 258] and slots[64:66].tolist() == [64, 65]
    assert slots.tolist() == oracle.out_cache_loc(0, 1000, -1, res.new_pages.tolist(), 64)


@pytest.mark.clause("C-ESTIMATE")
def test_estimate_of_the_first_spec_example():
    # Lane r computes pages r, r+4, r+8, r+12 as four runs [64k, 64k + 64) (the last page ends at 1000):
    # sum over its pages of 64 * end. Lane 0: 64 * (64 + 320 + 576 + 832) = 114688; lane 3: 64 * (256 + 512 + 768)
    # + 40 * 1000 = 138304.
    got = mqa_logits_elements(plan_request(0, 1000, interleave(4, 64)))
    assert got.tolist() == oracle.mqa_logits_elements([0], [1000], 4, 64, strategy="interleave")
    assert got[0] == 114688 and got[3] == 138304
    zig = mqa_logits_elements(plan_request(0, 1000, CPConfig(4, 64, "rotation")))
    assert got.max() < zig.max()  # the interleave split is better balanced for the indexer's buffer


@pytest.mark.clause("C-GATHER")
def test_gather_back_restores_flat_order():
    plan = plan_batch([0, 100, 64], [1000, 200, 7], interleave(4, 64), head_owners=[-1, 1, -1])
    M, C = plan.max_rank_tokens, 4
    gathered = np.full(C * M, -1, dtype=np.int64)
    for r in range(C):
        mine = np.flatnonzero(plan.token_owner == r)
        gathered[r * M : r * M + mine.size] = mine
    np.testing.assert_array_equal(gathered[plan.gather_index], np.arange(plan.num_tokens))
    assert (
        plan.gather_index.tolist()
        == oracle.plan_batch([0, 100, 64], [1000, 200, 7], 4, 64, [None, 1, None], strategy="interleave")[
            "gather_index"
        ]
    )


# ----------------------------------------------------------------------------------------------------
# the fast paths: closed-form counts, deferred runs, the cyclic pick
# ----------------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(C=st.integers(1, 9), P=st.sampled_from([1, 2, 16]), data=st.data())
def test_cyclic_pick_equals_the_pick_of_one_run_per_page(C, P, data):
    """``LanePool.pick_cyclic`` (the interleave allocation's pick, closed form) gives the pages and counts
    ``LanePool.pick`` gives for one run per page, on a pool with pages taken and freed in random order."""
    from cpkv.policy import cyclic_lane_pages

    caps = data.draw(st.lists(st.integers(2, 40), min_size=C, max_size=C), label="caps")
    alloc = OwnerLaneAllocator(interleave(C, P), caps)
    taken = []
    for r in data.draw(st.lists(st.integers(0, C - 1), max_size=30), label="taken"):
        if alloc.free_pages_per_lane()[r]:
            taken += alloc.alloc_pages([r]).tolist()
    alloc.free(data.draw(st.permutations(taken), label="order")[: len(taken) // 2])
    B = data.draw(st.integers(1, 4), label="B")
    Es = [data.draw(st.integers(0, 3 * C * P), label="E") for _ in range(B)]
    phases = [data.draw(st.integers(0, C - 1), label="phase") for _ in range(B)]
    plan = plan_batch([0] * B, Es, interleave(C, P), phases=phases)
    m = np.diff(plan.page_indptr)
    lane_pages = cyclic_lane_pages(m, plan.request_phases, C)
    assert lane_pages.sum(axis=0).tolist() == plan.new_pages_per_lane[:C].tolist()
    pool = alloc.pool
    if (plan.new_pages_per_lane[:C] > alloc.free_pages_per_lane()).any():
        return
    got, got_counts = pool.pick_cyclic(plan.request_phases, m, plan.page_owners, lane_pages)
    want, want_counts = pool.pick(plan.page_owners, np.ones_like(plan.page_owners))
    assert got.tolist() == want.tolist() and got_counts.tolist() == want_counts.tolist()


def test_runs_are_built_on_first_read_and_pickle():
    import copy
    import pickle

    plan = plan_batch([0, 100], [1000, 200], interleave(4, 64), head_owners=[-1, 1])
    assert plan.token_runs.__dict__.get("_make") is not None  # not built by planning
    for other in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan)):
        assert other.token_owner.tolist() == plan.token_owner.tolist()
    runs = plan.token_runs
    assert runs.__dict__.get("_make") is None and not runs.length.flags.writeable
    assert runs.owner.tolist() == [0, 1, 2, 3] * 4 + [
        1,
        2,
        3,
        0,
    ]  # request 1 (phase 2): its head run, 3 pages
    assert runs.length.tolist() == [64] * 15 + [40, 28, 64, 64, 44]
    assert runs.pages.tolist() == [1] * 16 + [0, 1, 1, 1]
    assert runs.req.tolist() == [0] * 16 + [1] * 4
    with pytest.raises(AttributeError, match="segments"):
        runs.segments  # noqa: B018


@pytest.mark.parametrize("C", [1, 3, 8])
def test_cyclic_tables_are_the_rule_at_every_size(C):
    from cpkv.interleave import _CYCLIC_MAX, _cyclic_view, cyclic

    for n in (0, 1, C, 4095, 4097, 70_000, _CYCLIC_MAX, _CYCLIC_MAX + 1):
        for start in {0, C - 1}:
            want = (start + np.arange(n, dtype=np.int64)) % C
            got = _cyclic_view(start, n, C)
            assert got.dtype == np.int64 and not got.flags.writeable and np.array_equal(got, want), (n, start)
            assert np.array_equal(cyclic(start, n, C), want)


def test_cyclic_tables_stay_bounded_over_many_cp_sizes():
    # A sweep plans one long request under many cp_sizes: only the _CYCLIC_TABLES most recently used tables
    # stay cached (each at most _CYCLIC_MAX + C int64), not one 8 MiB table per cp_size ever used.
    from cpkv import interleave as il

    n = il._CYCLIC_MAX // 8  # 131,072 pages at P=1: each table grows to 131,072 + C entries (1 MiB)
    for C in range(2, 12):
        got = plan_request(0, n, interleave(C, 1), req_index=1).page_owners
        assert got[0] == 1 % C and got[-1] == n % C
    assert len(il._CYCLIC) <= il._CYCLIC_TABLES == 4
    assert list(il._CYCLIC) == [8, 9, 10, 11]  # the most recently used, least recent first
    assert sum(t.nbytes for t in il._CYCLIC.values()) <= il._CYCLIC_TABLES * 8 * (il._CYCLIC_MAX + 11)
    # a table in use again moves to the end; a plan keeps its own view when its table is dropped
    kept = plan_request(0, 10, interleave(9, 1)).page_owners
    for C in (12, 13, 14, 15):
        plan_request(0, 5, interleave(C, 1))
    assert 9 not in il._CYCLIC and kept.tolist() == [k % 9 for k in range(10)]
