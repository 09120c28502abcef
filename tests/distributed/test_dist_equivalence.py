"""CP prefill on C real processes equals the single-process reference (SPEC C-LAYOUT, C-GATHER,
C-OWNER-EQ-COMPUTE, C-RELOAD), for C in {1, 2, 3, 4} and page_size in {1, 16, 64}, under every policy,
with ``kv_access = shared`` (C in {1, 2, 4}) and ``local`` (every C; its own checks: test_dist_local.py).

The cases (dense and NSA) come from ``matrix.cases_for``, one spawned gloo group per C (``conftest.run``).
Audited cases have every rank audit its own writes (ranks take turns and diff every pool).
"""

import numpy as np
import pytest
from matrix import PAGE_SIZES, SHARED_CS, by_name, cases_for

import oracle

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

TOL = 1e-5


@pytest.mark.clause("C-GATHER")
@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
def test_every_case_matches_single_process_reference(run):
    C, r = run
    results = r.results
    assert [res.name for res in results] == [c.name for c in cases_for(C)]
    for res in results:
        assert res.cp_size == C
        assert res.max_abs_err is not None and res.max_abs_err <= TOL, (res.name, res.max_abs_err)
        hidden = res.hidden()
        assert np.isfinite(hidden).all()
        # Every forward's every extend token was gathered: rows = sum of extend lengths.
        assert hidden.shape[0] == sum(sum(f.extend_lens) for f in res.forwards)


@pytest.mark.clause("C-GATHER")
def test_hidden_states_identical_across_policies(run):
    C, _ = run
    for kind in ("", "nsa-") * (C in SHARED_CS) + ("local-", "local-nsa-"):
        for P in PAGE_SIZES:
            ref = by_name(run, f"{kind}P{P}-rotation").hidden()
            for pol in ("legacy", "balanced"):
                np.testing.assert_allclose(by_name(run, f"{kind}P{P}-{pol}").hidden(), ref, rtol=0, atol=TOL)


@pytest.mark.clause("C-LAYOUT")
def test_direct_write_only_own_lane(run):
    """Each rank, writing alone, changed only rows of its own lane, only its own tokens' rows, which read
    back through read_slots as written; at the end every row nobody wrote still holds its NaN guard."""
    C, r = run
    audited = [c.name for c in cases_for(C) if c.audit_writes]
    assert {"local-P16-rotation", "local-mha", "local-reload", "local-nsa-P16-balanced"} <= set(audited)
    if C in SHARED_CS:
        assert {"P1-rotation", "mha-mirrored", "reload", "nsa-P16-balanced", "nsa-reload"} <= set(audited)
    for outcome in r.outcomes:
        for res in outcome.result:
            if res.name not in audited:
                continue
            assert res.audits, res.name
            # One audit per forward, layer and pool; NSA cases audit the index-K pool too.
            pools = {"latent", "index_k"} if res.attention == "nsa" else {"latent"}
            assert {a.pool for a in res.audits} == pools, res.name
            for a in res.audits:
                assert a.rank == outcome.rank
                assert (a.rows_outside_lane, a.rows_unexpected, a.rows_misread) == (0, 0, 0), (res.name, a)
                assert a.rows_changed <= a.rows_written
            # rows_written per forward (and decode step) and layer = this rank's share of the plan.
            share = {f.index: f.per_rank_tokens[outcome.rank] for f in res.forwards}
            for d in res.decodes:
                for j in range(d.steps):
                    share[d.first_index + j] = sum(lanes[j] == outcome.rank for lanes in d.token_lanes)
            assert all(a.rows_written == share[a.forward] for a in res.audits)
    for res in r.results:
        assert res.unwritten_rows_intact is True, res.name


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@pytest.mark.clause("C-PHASE")
def test_each_rank_computes_the_oracle_share(run):
    """Tokens computed by rank r in each forward = the independent oracle's per_rank_tokens[r]."""
    C, r = run
    for k, res0 in enumerate(r.results):
        P = res0.page_size
        for f in res0.forwards:
            pol = res0.policy
            want = oracle.plan_batch(
                f.prefix_lens,
                f.extend_lens,
                C,
                P,
                head_owners=f.head_owners,
                phases=f.phases if pol == "balanced" else None,
                policy=pol,
            )
            assert f.phases == want["request_phases"], (res0.name, f.index)
            own = [o.result[k].forwards[f.index].own_tokens for o in r.outcomes]
            assert own == want["per_rank_tokens"] == f.per_rank_tokens, (res0.name, f.index)


def test_workload_covers_the_acceptance_matrix(run):
    """The batches really mix aligned and unaligned prefix hits, short extends and 3+ chunks."""
    C, r = run
    for P in PAGE_SIZES:
        res = by_name(run, f"{'' if C in SHARED_CS else 'local-'}P{P}-rotation")
        fw = res.forwards
        mixed = [
            f
            for f in fw
            if any(L % P for L in f.prefix_lens) and any(L and L % P == 0 for L in f.prefix_lens)
        ]
        if P > 1:
            assert mixed, f"P={P}: no batch mixing aligned and unaligned prefixes"
        assert any(0 < e < 2 * C for f in fw for e in f.extend_lens)
        rid_forwards = {}
        for f in fw:
            for rid in f.request_ids:
                rid_forwards[rid] = rid_forwards.get(rid, 0) + 1
        assert max(rid_forwards.values()) >= 4  # prefix fill + 3 chunks
        assert res.cache_counters["matched_tokens"] > 0
        assert any(h > 0 for f in fw for h in f.cache_hit_tokens)


@pytest.mark.clause("C-RELOAD")
def test_reload_from_host_tier_on_owner_lanes(run):
    """Wave 2 after a cache flush loads pages back on their recorded lanes; only the owner rank holds
    (and restores) a page's host copy, and the result still equals the reference (both access modes)."""
    C, _ = run
    for name in ["reload"] * (C in SHARED_CS) + ["local-reload"]:
        res = by_name(run, name)
        cc = res.cache_counters
        assert cc["backups"] > 0 and cc["load_backs"] > 0, name
        assert cc["load_back_owner_lane_capacity_failed"] == 0
        assert res.max_abs_err <= TOL


def test_mha_on_mirrored_kv_buffer_and_mla576(run):
    if run[0] not in SHARED_CS:
        pytest.skip("shared-access cases run at C in {1, 2, 4}")
    mha = by_name(run, "mha-mirrored")
    assert mha.kv_buffer == "mirrored" and mha.max_abs_err <= TOL
    mla = by_name(run, "mla576")
    assert mla.kv_buffer == "shm" and mla.max_abs_err <= TOL
