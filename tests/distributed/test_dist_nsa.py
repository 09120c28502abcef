"""DeepSeek sparse attention under CP (SPEC C-NSA, C-ESTIMATE), on C real processes for C in {1, 2, 4}.

The NSA cases of ``matrix.cases_for`` (page_size {1, 16, 64} x every policy, DeepSeek widths, host-tier
reload, k above every visible key, unequal lanes) run in the same spawned groups as the dense ones
(``conftest.run``). Checked per case: the output against the single-process reference, the top-k rows
against the reference's, each rank's materialised logits elements against ``mqa_logits_elements`` and
the independent oracle, and the shape rules of the top-k rows themselves.
"""

import numpy as np
import pytest
from matrix import NSA_TOPK, PAGE_SIZES, POLICIES, by_name, tight_lanes

import oracle

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

TOL = 1e-5


def nsa_results(run):
    _, r = run
    out = [res for res in r.results if res.attention == "nsa"]
    assert len(out) == len(PAGE_SIZES) * len(POLICIES) + 4
    return out


@pytest.mark.clause("C-NSA")
def test_nsa_matches_single_process_reference(run):
    """Every NSA case: output within 1e-5 of one process, and every top-k row (tokens x layers) equal to
    the reference's except at near ties (k-th and (k+1)-th reference logits within 1e-6 relative)."""
    for res in nsa_results(run):
        assert res.max_abs_err is not None and res.max_abs_err <= TOL, (res.name, res.max_abs_err)
        assert np.isfinite(res.hidden()).all()
        rows, mismatched, near = res.topk_counts()
        assert rows == sum(sum(f.extend_lens) for f in res.forwards) * 2  # tokens x 2 layers
        assert mismatched == near, (res.name, mismatched, near)


@pytest.mark.clause("C-NSA")
def test_topk_rows_follow_the_rules(run):
    """Each token's selected positions: min(k, p + 1) distinct positions <= p, ascending, then -1 up to k.
    Every case has rows that select (more than k visible keys) and rows that pad (fewer)."""
    for res in nsa_results(run):
        k = 4096 if res.name == "nsa-all-keys" else 16 if res.name == "nsa576" else NSA_TOPK
        padded = selected = 0
        for f in res.forwards:
            pos = np.concatenate(
                [np.arange(L0, L0 + E) for L0, E in zip(f.prefix_lens, f.extend_lens, strict=True)]
            )
            topk = f.topk  # [N, layers, k]
            assert topk.shape == (pos.shape[0], 2, k)
            count = np.minimum(k, pos + 1)
            for layer in range(2):
                t = topk[:, layer]
                valid = t >= 0
                assert (valid.sum(1) == count).all(), res.name
                assert (valid[:, :-1] >= valid[:, 1:]).all()  # -1 only after the kept positions
                kept = np.where(valid, t, -1)
                assert (kept.max(1) <= pos).all()
                assert ((np.diff(t, axis=1) > 0) | ~valid[:, 1:]).all()  # kept positions ascending
            padded += int((pos + 1 < k).sum())
            selected += int((pos + 1 > k).sum())
        assert padded > 0, res.name
        if res.name != "nsa-all-keys":
            assert selected > 0, res.name


@pytest.mark.clause("C-ESTIMATE")
@pytest.mark.clause("C-NSA")
def test_measured_logits_equal_the_estimate(run):
    """On every forward of every NSA case, every rank materialised, in every layer, exactly the elements
    that mqa_logits_elements and the independent oracle (tests/oracle.py) predict for it."""
    C, r = run
    for k, res in enumerate(r.results):
        if res.attention != "nsa":
            continue
        for f in res.forwards:
            want = oracle.mqa_logits_elements(
                f.prefix_lens, f.extend_lens, C, res.page_size, head_owners=f.head_owners, phases=f.phases
            )  # fmt: skip
            assert f.logits_estimated == want, (res.name, f.index)
            assert f.logits_measured == [[w, w] for w in want], (res.name, f.index)
            # Every rank recorded the same gathered counts.
            assert all(o.result[k].forwards[f.index].logits_measured == f.logits_measured for o in r.outcomes)
        assert res.logits_match is True


@pytest.mark.clause("C-ESTIMATE")
def test_phase_zero_estimate_undersizes_a_rotated_rank(run):
    """An estimate that assumes phase 0 (the legacy plan, same head owners) is below what a rotated rank
    really materialised in some forward: the reason the estimator uses each request's own phase."""
    C, r = run
    short = []
    for res in r.results:
        if res.attention != "nsa" or res.policy == "legacy":
            continue
        for f in res.forwards:
            phase0 = oracle.mqa_logits_elements(
                f.prefix_lens, f.extend_lens, C, res.page_size, head_owners=f.head_owners, policy="legacy"
            )  # fmt: skip
            measured = [row[0] for row in f.logits_measured]
            short += [(res.name, f.index, rank) for rank in range(C) if measured[rank] > phase0[rank]]
    if C == 1:
        assert short == []  # one rank: every phase is 0
    else:
        assert short, "no forward where a phase-0 estimate under-sizes a rank"


@pytest.mark.clause("C-NSA")
def test_topk_above_every_visible_key_is_dense_attention(run):
    """With k larger than every visible key each row keeps all its keys (padded with -1), so sparse MLA
    must reproduce dense MLA: the NSA model has the dense model's weights plus its indexer."""
    sparse, dense = by_name(run, "nsa-all-keys"), by_name(run, "P16-rotation")
    np.testing.assert_allclose(sparse.hidden(), dense.hidden(), rtol=0, atol=TOL)


@pytest.mark.clause("C-NSA")
@pytest.mark.clause("C-RELOAD")
def test_index_k_pages_reload_with_latent_pages(run):
    """After a flush to the host tier, wave 2 loads its prefix pages back on their recorded lanes: the
    owner rank restores the page's index-K rows with its latent rows (a missing index row would read
    the NaN guard or a stale key and change the top-k); the result still equals the reference."""
    res = by_name(run, "nsa-reload")
    cc = res.cache_counters
    assert cc["backups"] > 0 and cc["load_backs"] > 0
    assert cc["load_back_owner_lane_capacity_failed"] == 0
    assert res.max_abs_err <= TOL and res.logits_match is True
    _, mismatched, near = res.topk_counts()
    assert mismatched == near
    assert res.unwritten_rows_intact is True


@pytest.mark.clause("C-ALLOC")
def test_unequal_lane_capacities(run):
    """Lanes of unequal capacity (one int per lane): the run stays on each lane's first Q_r pages, fills
    the tightest exactly, and equals the reference."""
    C, _ = run
    res = by_name(run, "nsa-unequal-lanes")
    caps = tight_lanes(C, 16)
    assert res.pages_per_lane == caps
    if C > 1:
        assert len(set(caps)) > 1
    assert all(u <= q for u, q in zip(res.lane_pages_used, caps, strict=True))
    assert any(u == q for u, q in zip(res.lane_pages_used, caps, strict=True))
    assert res.max_abs_err <= TOL and res.logits_match is True
