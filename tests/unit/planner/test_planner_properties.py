"""Property tests: the production planner and estimator against the independent oracle (tests/oracle.py).

Random requests and batches (cp_size 1..16, page_size 1..256, unaligned prefixes, tiny and empty extends,
batches up to 32 requests, every owner policy, both CP strategies, explicit phases) must give exactly the
oracle's phase,
owners and counts, and satisfy the SPEC invariants checked here without the oracle (owner == compute,
zigzag segment sizes, gather-back, batch == per-request plans).
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from cpkv import CPConfig, mqa_logits_elements, owner_lane_phase, plan_batch, plan_request
from cpkv.errors import ConfigError, PlanError, UnsupportedPagePlan

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=150, deadline=None)
POLICIES = ("rotation", "legacy", "balanced")
STRATEGIES = ("zigzag", "interleave")  # every property below runs under both (C-INTERLEAVE)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------------------------------
# strategies
# ----------------------------------------------------------------------------------------------------


@st.composite
def sizes(draw):
    """(cp_size, page_size): small values often, the full range sometimes."""
    C = draw(st.one_of(st.integers(1, 4), st.integers(1, 16)))
    P = draw(st.one_of(st.sampled_from([1, 2, 3, 16, 64]), st.integers(1, 256)))
    return C, P


@st.composite
def prefix_lens(draw, P: int):
    """0, a multiple of P, or (often) not a multiple of P."""
    k = draw(st.integers(0, 40))
    kind = draw(st.sampled_from(["zero", "aligned", "unaligned", "unaligned", "any"]))
    if kind == "zero":
        return 0
    if kind == "aligned" or P == 1:
        return k * P
    if kind == "unaligned":
        return k * P + draw(st.integers(1, P - 1))
    return draw(st.integers(0, 40 * P + P))


@st.composite
def extend_lens(draw, C: int, P: int, cap: int):
    """0, fewer than 2C tokens, a little over a page boundary, or up to a few zigzag rounds (<= cap)."""
    kind = draw(st.sampled_from(["zero", "tiny", "pages", "pages", "any", "any"]))
    if kind == "zero":
        return 0
    if kind == "tiny":
        return draw(st.integers(1, max(1, 2 * C - 1)))
    if kind == "pages":
        return max(0, min(cap, draw(st.integers(0, 4 * C)) * P + draw(st.integers(-1, 1))))
    return draw(st.integers(0, min(cap, 3 * 2 * C * P)))


@st.composite
def requests(draw, C: int, P: int, cap: int):
    """(prefix_len, extend_len, head_owner) with a head owner whenever the request has head tokens."""
    L0 = draw(prefix_lens(P))
    E = draw(extend_lens(C, P, cap))
    needs_head = L0 % P != 0 and E > 0
    if needs_head:
        head = draw(st.integers(0, C - 1))
    else:
        head = draw(st.one_of(st.none(), st.integers(0, C - 1)))  # optional when there is no head
    return L0, E, head


@st.composite
def single_cases(draw):
    C, P = draw(sizes())
    L0, E, head = draw(requests(C, P, cap=4000))
    req_index = draw(st.integers(0, 40))
    phase = draw(st.one_of(st.none(), st.integers(0, C - 1)))
    policy = draw(st.sampled_from(POLICIES))
    strategy = draw(st.sampled_from(STRATEGIES))
    return dict(
        C=C, P=P, L0=L0, E=E, head=head, req_index=req_index, phase=phase, policy=policy, strategy=strategy
    )


@st.composite
def batch_cases(draw, max_batch: int = 32):
    C, P = draw(sizes())
    B = draw(st.one_of(st.integers(1, 4), st.integers(1, max_batch)))
    reqs = draw(st.lists(requests(C, P, cap=300), min_size=B, max_size=B))
    phases = draw(st.one_of(st.none(), st.lists(st.integers(0, C - 1), min_size=B, max_size=B)))
    policy = draw(st.sampled_from(POLICIES))
    # None and -1 both mean "no head owner".
    heads = [(-1 if draw(st.booleans()) else None) if h is None else h for _, _, h in reqs]
    strategy = draw(st.sampled_from(STRATEGIES))
    return dict(
        C=C,
        P=P,
        L0=[r[0] for r in reqs],
        E=[r[1] for r in reqs],
        heads=heads,
        phases=phases,
        policy=policy,
        strategy=strategy,
    )


def config(case) -> CPConfig:
    return CPConfig(case["C"], case["P"], owner_policy=case["policy"], cp_strategy=case["strategy"])


def prod_request(case):
    cfg = config(case)
    return plan_request(
        case["L0"], case["E"], cfg, req_index=case["req_index"], head_owner=case["head"], phase=case["phase"]
    )


def oracle_request(case):
    keys = ("L0", "E", "C", "P", "req_index", "head", "phase", "policy", "strategy")
    return oracle.plan_request(*(case[k] for k in keys))


def prod_batch(case):
    cfg = config(case)
    return plan_batch(case["L0"], case["E"], cfg, head_owners=case["heads"], phases=case["phases"])


def oracle_batch(case):
    return oracle.plan_batch(
        case["L0"],
        case["E"],
        case["C"],
        case["P"],
        case["heads"],
        case["phases"],
        case["policy"],
        case["strategy"],
    )


def assert_int64(arr, shape):
    assert isinstance(arr, np.ndarray)
    assert arr.dtype == np.int64
    assert arr.shape == shape


def assert_request_equal(got, want, C):
    """A production RequestPlan equals an oracle plan dict, field by field."""
    E = len(want["token_owner"])
    assert got.phase == want["phase"]
    assert got.head_tokens == want["head_tokens"]
    assert_int64(got.page_owners, (len(want["page_owners"]),))
    assert_int64(got.token_owner, (E,))
    assert_int64(got.per_rank_tokens, (C,))
    assert got.page_owners.tolist() == want["page_owners"]
    assert got.token_owner.tolist() == want["token_owner"]
    assert got.per_rank_tokens.tolist() == want["per_rank_tokens"]
    assert got.last_token_owner == want["last_token_owner"]
    if want["head_tokens"] > 0:
        assert got.head_owner == want["head_owner"]


def assert_same_request(a, b):
    """Two production RequestPlans agree on every planned field."""
    assert (a.prefix_len, a.extend_len, a.phase, a.head_tokens, a.last_token_owner) == (
        b.prefix_len,
        b.extend_len,
        b.phase,
        b.head_tokens,
        b.last_token_owner,
    )
    assert a.page_owners.tolist() == b.page_owners.tolist()
    assert a.token_owner.tolist() == b.token_owner.tolist()
    assert a.per_rank_tokens.tolist() == b.per_rank_tokens.tolist()


# ----------------------------------------------------------------------------------------------------
# one request
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-ZIGZAG")
@pytest.mark.clause("C-INTERLEAVE")
@SETTINGS
@given(single_cases())
def test_request_matches_oracle(case):
    got = prod_request(case)
    assert_request_equal(got, oracle_request(case), case["C"])
    assert (got.prefix_len, got.extend_len, got.req_index) == (case["L0"], case["E"], case["req_index"])


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@SETTINGS
@given(single_cases())
def test_owner_equals_compute_and_tokens_conserved(case):
    got = prod_request(case)
    C, P, L0, E = case["C"], case["P"], case["L0"], case["E"]
    first_new = ceil_div(L0, P)
    assert got.page_owners.shape == (ceil_div(L0 + E, P) - first_new,)
    assert ((got.page_owners >= 0) & (got.page_owners < C)).all()
    pos = L0 + np.arange(E)
    page = pos // P
    is_head = page < first_new
    assert int(is_head.sum()) == got.head_tokens == (min(E, P - L0 % P) if L0 % P else 0)
    want = np.where(is_head, -2 if case["head"] is None else case["head"], 0)
    want[~is_head] = got.page_owners[page[~is_head] - first_new]
    np.testing.assert_array_equal(got.token_owner, want)
    np.testing.assert_array_equal(got.per_rank_tokens, np.bincount(got.token_owner, minlength=C))
    assert int(got.per_rank_tokens.sum()) == E
    assert got.last_token_owner == (int(got.token_owner[-1]) if E else -1)


def zigzag_split_exists(page_owners: list[int], phase: int, C: int) -> bool:
    """Can page_owners be cut, in order, into 2C segments of floor(m/2C) or ceil(m/2C) pages each, where
    segment s is owned by (z(s) + phase) % C? Checked by walking the segments with every reachable cut."""
    m = len(page_owners)
    lo, hi = m // (2 * C), ceil_div(m, 2 * C)
    reachable = {0}
    for s in range(2 * C):
        owner = ((s if s < C else 2 * C - 1 - s) + phase) % C
        nxt = set()
        for k in reachable:
            for n in {lo, hi}:
                if k + n <= m and all(o == owner for o in page_owners[k : k + n]):
                    nxt.add(k + n)
        reachable = nxt
    return m in reachable


@pytest.mark.clause("C-ZIGZAG")
@SETTINGS
@given(single_cases())
def test_zigzag_segments_differ_by_at_most_one_page(case):
    case = dict(case, strategy="zigzag")
    got = prod_request(case)
    assert zigzag_split_exists(got.page_owners.tolist(), got.phase, case["C"])
    # And the oracle's own cut: the first m % 2C segments carry the extra page.
    want = oracle_request(case)
    seg_sizes = [want["page_segments"].count(s) for s in range(2 * case["C"])]
    assert max(seg_sizes) - min(seg_sizes) <= 1
    assert seg_sizes == sorted(seg_sizes, reverse=True)


@pytest.mark.clause("C-ZIGZAG")
@SETTINGS
@given(sizes(), st.integers(0, 20), st.integers(1, 3), st.integers(0, 40))
def test_zigzag_balances_full_rounds(cp_page, k, rounds, req_index):
    # An aligned request of whole zigzag rounds (2C pages each) gives every rank exactly E / C tokens.
    C, P = cp_page
    E = rounds * 2 * C * P
    got = plan_request(k * P, E, CPConfig(C, P, owner_policy="rotation"), req_index=req_index)
    assert got.per_rank_tokens.tolist() == [E // C] * C


# ----------------------------------------------------------------------------------------------------
# phase
# ----------------------------------------------------------------------------------------------------


@pytest.mark.clause("C-PHASE")
@SETTINGS
@given(sizes(), st.integers(0, 100_000), st.integers(0, 100))
def test_owner_lane_phase_matches_oracle(cp_page, L0, i):
    C, P = cp_page
    assert owner_lane_phase(L0, P, i, C) == oracle.phase(L0, P, i, C, "rotation")


@pytest.mark.clause("C-PHASE")
@SETTINGS
@given(single_cases())
def test_policies_and_explicit_phase(case):
    C, P, L0, E, head, i = case["C"], case["P"], case["L0"], case["E"], case["head"], case["req_index"]
    S = case["strategy"]  # the phase rule is the same under both strategies (C-INTERLEAVE)
    rotation = oracle.phase(L0, P, i, C, "rotation")
    for policy, want in (("rotation", rotation), ("balanced", rotation), ("legacy", 0)):
        got = plan_request(
            L0, E, CPConfig(C, P, owner_policy=policy, cp_strategy=S), req_index=i, head_owner=head
        )
        assert got.phase == want
    explicit = (rotation + 1) % C
    for policy in POLICIES:
        got = plan_request(
            L0,
            E,
            CPConfig(C, P, owner_policy=policy, cp_strategy=S),
            req_index=i,
            head_owner=head,
            phase=explicit,
        )
        assert got.phase == explicit


@pytest.mark.clause("C-PHASE")
@pytest.mark.parametrize(("env", "want_phase"), [("legacy", 0), ("rotation", 3), ("balanced", 3)])
def test_policy_from_environment(monkeypatch, env, want_phase):
    # L0 = 3 pages, i = 0: rotation phase (3 + 0) % 4 = 3; legacy 0.
    monkeypatch.setenv("CPKV_OWNER_POLICY", env)
    cfg = CPConfig(4, 64)
    assert cfg.owner_policy == env
    assert plan_request(192, 64, cfg).phase == want_phase


@pytest.mark.clause("C-PHASE")
def test_bad_policy_names_the_variable(monkeypatch):
    monkeypatch.setenv("CPKV_OWNER_POLICY", "roundrobin")
    with pytest.raises(ConfigError, match="CPKV_OWNER_POLICY") as err:
        CPConfig(4, 64)
    assert "roundrobin" in str(err.value)
    with pytest.raises(ConfigError, match="roundrobin"):
        CPConfig(4, 64, owner_policy="roundrobin")


@pytest.mark.clause("C-ZIGZAG")
@pytest.mark.parametrize(
    ("C", "P", "L0", "E", "i", "head"),
    [(4, 64, 0, 1000, 0, None), (4, 64, 0, 1000, 1, None), (4, 64, 100, 200, 0, 1), (2, 1, 0, 5, 0, None)],
)
def test_spec_examples(C, P, L0, E, i, head):
    # The SPEC section 4 examples; test_oracle_examples.py pins the oracle's answers to the SPEC text.
    got = plan_request(L0, E, CPConfig(C, P, owner_policy="rotation"), req_index=i, head_owner=head)
    assert_request_equal(got, oracle.plan_request(L0, E, C, P, i, head), C)


# ----------------------------------------------------------------------------------------------------
# batches
# ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.clause("C-BATCH")
@SETTINGS
@given(batch_cases())
def test_batch_matches_oracle(case):
    got, want = prod_batch(case), oracle_batch(case)
    C, B = case["C"], len(case["L0"])
    N = sum(case["E"])
    assert len(got.requests) == B
    for r_got, r_want in zip(got.requests, want["requests"], strict=True):
        assert_request_equal(r_got, r_want, C)
    assert_int64(got.token_owner, (N,))
    assert_int64(got.page_owners, (len(want["page_owners"]),))
    assert_int64(got.per_rank_tokens, (C,))
    assert_int64(got.request_phases, (B,))
    assert_int64(got.last_token_owner, (B,))
    assert_int64(got.gather_index, (N,))
    assert got.token_owner.tolist() == want["token_owner"]
    assert got.page_owners.tolist() == want["page_owners"]
    assert got.per_rank_tokens.tolist() == want["per_rank_tokens"]
    assert got.request_phases.tolist() == want["request_phases"]
    assert got.last_token_owner.tolist() == want["last_token_owner"]
    assert got.max_rank_tokens == want["max_rank_tokens"]
    assert got.gather_index.tolist() == want["gather_index"]
    assert int(got.per_rank_tokens.sum()) == N
    assert (got.config.cp_size, got.config.page_size) == (C, case["P"])


@pytest.mark.slow
@pytest.mark.clause("C-BATCH")
@SETTINGS
@given(batch_cases())
def test_batch_request_i_is_plan_request_at_index_i(case):
    got = prod_batch(case)
    cfg = config(case)
    offset = 0
    for i, (L0, E, head) in enumerate(zip(case["L0"], case["E"], case["heads"], strict=True)):
        phase = None if case["phases"] is None else case["phases"][i]
        single = plan_request(L0, E, cfg, req_index=i, head_owner=None if head == -1 else head, phase=phase)
        assert_same_request(got.requests[i], single)
        assert got.requests[i].req_index == i
        # Flat order: request i's tokens are token_owner[cum_E[i] : cum_E[i+1]].
        assert got.token_owner[offset : offset + E].tolist() == single.token_owner.tolist()
        offset += E


@pytest.mark.clause("C-BS1-COMPATIBILITY")
@pytest.mark.clause("C-INTERLEAVE")
@SETTINGS
@given(single_cases())
def test_batch_of_one_equals_single_request(case):
    case = dict(case, req_index=0)
    single = prod_request(case)
    cfg = config(case)
    phases = None if case["phase"] is None else [case["phase"]]
    batch = plan_batch([case["L0"]], [case["E"]], cfg, head_owners=[case["head"]], phases=phases)
    assert_same_request(batch.requests[0], single)
    assert batch.token_owner.tolist() == single.token_owner.tolist()
    assert batch.page_owners.tolist() == single.page_owners.tolist()
    assert batch.per_rank_tokens.tolist() == single.per_rank_tokens.tolist()
    assert batch.request_phases.tolist() == [single.phase]
    assert batch.last_token_owner.tolist() == [single.last_token_owner]


@pytest.mark.clause("C-BATCH")
@settings(max_examples=40, deadline=None)
@given(batch_cases(max_batch=8))
def test_batch_accepts_numpy_and_tensor_inputs(case):
    want = prod_batch(case)
    cfg = config(case)
    heads = [-1 if h is None else h for h in case["heads"]]
    phases = case["phases"]
    for conv in (np.asarray, lambda v: torch.tensor(v, dtype=torch.int64)):
        got = plan_batch(
            conv(case["L0"]),
            conv(case["E"]),
            cfg,
            head_owners=conv(heads),
            phases=None if phases is None else conv(phases),
        )
        assert got.token_owner.tolist() == want.token_owner.tolist()
        assert got.gather_index.tolist() == want.gather_index.tolist()
        assert got.request_phases.tolist() == want.request_phases.tolist()


# ----------------------------------------------------------------------------------------------------
# gather-back
# ----------------------------------------------------------------------------------------------------


def simulated_all_gather(token_owner: np.ndarray, C: int, M: int, send_order) -> np.ndarray:
    """Each rank holds its tokens' flat ids (ascending), padded to M rows with -1; chunks arrive in
    ``send_order`` and are placed at row rank * M."""
    gathered = np.full(C * M, -2, dtype=np.int64)
    for rank in send_order:
        local = np.flatnonzero(token_owner == rank)
        assert local.size <= M
        chunk = np.concatenate([local, np.full(M - local.size, -1, dtype=np.int64)])
        gathered[rank * M : (rank + 1) * M] = chunk
    return gathered


@pytest.mark.slow
@pytest.mark.clause("C-GATHER")
@SETTINGS
@given(batch_cases(), st.data())
def test_gather_index_restores_flat_order(case, data):
    got = prod_batch(case)
    C = case["C"]
    N = sum(case["E"])
    M = got.max_rank_tokens
    assert M == int(got.per_rank_tokens.max())
    assert ((got.gather_index >= 0) & (got.gather_index < C * M)).all()
    # Rank order 0..C-1, then the same chunks sent in a permuted order but placed by rank.
    for order in (range(C), data.draw(st.permutations(range(C)))):
        gathered = simulated_all_gather(got.token_owner, C, M, order)
        assert gathered.shape == (C * M,)
        np.testing.assert_array_equal(gathered[got.gather_index], np.arange(N))


# ----------------------------------------------------------------------------------------------------
# estimate
# ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.clause("C-ESTIMATE")
@SETTINGS
@given(batch_cases())
def test_estimate_matches_oracle_and_bounds_per_segment(case):
    got = mqa_logits_elements(prod_batch(case))
    keys = ("L0", "E", "C", "P", "heads", "phases", "policy", "strategy")
    args = tuple(case[k] for k in keys)
    assert_int64(got, (case["C"],))
    assert got.tolist() == oracle.mqa_logits_elements(*args)
    assert (got >= np.asarray(oracle.mqa_logits_elements_per_segment(*args))).all()


@pytest.mark.clause("C-ESTIMATE")
def test_estimate_uses_the_request_phase():
    # C=4, P=64, L0=0, E=1000 at i=1 (phase 1): the short rank is 1, not 0 as a phase-0 estimate assumes.
    # rank 0 (pages 6..9, positions 384..639 as one run): 256 * 640 = 163840.
    cfg = CPConfig(4, 64, owner_policy="rotation")
    rotated = mqa_logits_elements(plan_batch([0, 0], [0, 1000], cfg))
    assert rotated.tolist() == oracle.mqa_logits_elements([0, 0], [0, 1000], 4, 64)
    assert rotated[0] == 256 * 640
    phase0 = mqa_logits_elements(plan_batch([0, 0], [0, 1000], cfg, phases=[0, 0]))
    assert rotated.tolist() != phase0.tolist()


# ----------------------------------------------------------------------------------------------------
# fail fast
# ----------------------------------------------------------------------------------------------------


def raises_naming(err_cls, *fragments):
    """pytest.raises for err_cls whose message contains every fragment (request index, name, value)."""
    return pytest.raises(err_cls, match="".join(f"(?=.*{frag})" for frag in fragments))


@pytest.mark.clause("C-FAIL-FAST")
@pytest.mark.parametrize(
    ("L0", "E", "fragments"),
    [
        ([0, 0, 0, 0], [1, 2, 3, -5], ("request 3", "extend_len", "-5")),
        ([0, -7, 0], [1, 1, 1], ("request 1", "prefix_len", "-7")),
    ],
)
def test_negative_lengths(L0, E, fragments):
    cfg = CPConfig(4, 64, owner_policy="rotation")
    with raises_naming(PlanError, *fragments):
        plan_batch(L0, E, cfg)


@pytest.mark.clause("C-FAIL-FAST")
def test_negative_lengths_single_request_names_its_index():
    cfg = CPConfig(4, 64, owner_policy="rotation")
    with raises_naming(PlanError, "request 2", "extend_len", "-1"):
        plan_request(0, -1, cfg, req_index=2)
    with raises_naming(PlanError, "request 0", "prefix_len", "-64"):
        plan_request(-64, 1, cfg)
    with raises_naming(PlanError, "req_index", "-3"):
        plan_request(0, 1, cfg, req_index=-3)


@pytest.mark.clause("C-FAIL-FAST")
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(prefix_lens=[0] * 5, extend_lens=[1] * 3),
        dict(prefix_lens=[0] * 5, extend_lens=[1] * 5, head_owners=[0] * 3),
        dict(prefix_lens=[0] * 5, extend_lens=[1] * 5, phases=[0] * 3),
    ],
)
def test_mismatched_lengths(kwargs):
    with raises_naming(PlanError, "5", "3"):
        plan_batch(config=CPConfig(4, 64, owner_policy="rotation"), **kwargs)


@pytest.mark.clause("C-HEAD")
@pytest.mark.parametrize("bad", [4, 7, -2])
def test_head_owner_out_of_range(bad):
    cfg = CPConfig(4, 64, owner_policy="rotation")
    with raises_naming(PlanError, "request 1", "head_owner", str(bad)):
        plan_batch([0, 100], [5, 5], cfg, head_owners=[0, bad])
    with raises_naming(PlanError, "request 0", "head_owner", str(bad)):
        plan_request(100, 5, cfg, head_owner=bad)


@pytest.mark.clause("C-PHASE")
@pytest.mark.parametrize("bad", [4, 9, -1])
def test_phase_out_of_range(bad):
    cfg = CPConfig(4, 64, owner_policy="rotation")
    with raises_naming(PlanError, "request 1", "phase", str(bad)):
        plan_batch([0, 0], [5, 5], cfg, phases=[0, bad])
    with raises_naming(PlanError, "phase", str(bad)):
        plan_request(0, 5, cfg, phase=bad)


@pytest.mark.clause("C-HEAD")
@pytest.mark.parametrize("heads", [None, [0, None, 2], [0, -1, 2]])
def test_missing_head_owner(heads):
    cfg = CPConfig(4, 64, owner_policy="rotation")
    with raises_naming(UnsupportedPagePlan, "request 1", "100", "head_owner"):
        plan_batch([0, 100, 64], [5, 5, 5], cfg, head_owners=heads)
    with raises_naming(UnsupportedPagePlan, "request 0", "100"):
        plan_request(100, 5, cfg)
    assert issubclass(UnsupportedPagePlan, PlanError) and issubclass(PlanError, ValueError)


@pytest.mark.clause("C-HEAD")
def test_no_head_owner_needed_without_head_tokens():
    # Unaligned prefix but E == 0, or aligned prefix: no head tokens, so no head owner is required.
    cfg = CPConfig(4, 64, owner_policy="rotation")
    empty = plan_request(100, 0, cfg)
    assert (empty.head_tokens, empty.last_token_owner) == (0, -1)
    assert (empty.page_owners.size, empty.token_owner.size) == (0, 0)
    assert empty.per_rank_tokens.tolist() == [0, 0, 0, 0]
    assert plan_request(128, 5, cfg).head_tokens == 0


@pytest.mark.slow
@pytest.mark.clause("C-FAIL-FAST")
@SETTINGS
@given(batch_cases(), st.data())
def test_first_bad_request_is_named(case, data):
    # Corrupt one request of a valid batch; the error names that request and its value.
    B = len(case["L0"])
    j = data.draw(st.integers(0, B - 1))
    bad = data.draw(st.integers(-1000, -1))
    E = list(case["E"])
    E[j] = bad
    cfg = config(case)
    with raises_naming(PlanError, f"request {j}\\b", "extend_len", str(bad)):
        plan_batch(case["L0"], E, cfg, head_owners=case["heads"], phases=case["phases"])


@pytest.mark.clause("C-FAIL-FAST")
@pytest.mark.parametrize(
    ("C", "P", "name", "value"), [(0, 64, "cp_size", "0"), (4, 0, "page_size", "0"), (-1, 1, "cp_size", "-1")]
)
def test_bad_sizes(C, P, name, value):
    with raises_naming(ConfigError, name, value):
        CPConfig(C, P, owner_policy="rotation")
