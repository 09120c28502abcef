"""DeepSeek sparse attention under CP (SPEC C-NSA, C-ESTIMATE, C-MERGE), on C real processes for C in
{1, 2, 3, 4}.

The NSA cases of ``matrix.cases_for`` (page_size {1, 16, 64} x every policy, DeepSeek widths, host-tier
reload, k above every visible key, unequal lanes; under ``kv_access = shared`` at C in {1, 2, 4} and
``local`` at every C, with decode) run in the same spawned groups as the dense ones (``conftest.run``).
Checked per case: the output against the single-process reference, the top-k rows against the
reference's, each rank's materialised logits elements against ``mqa_logits_elements`` (``shared``) or
``local_logits_elements`` (``local``) and the independent oracle, and the shape rules of the top-k rows.
"""

import numpy as np
import pytest
from matrix import NSA_TOPK, PAGE_SIZES, POLICIES, SHARED_CS, TIES_REPEATS, by_name, tight_lanes

import oracle

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

TOL = 1e-5


def nsa_results(run):
    """Every NSA case of the group: 13 shared (C in {1, 2, 4}), 12 + the integer-logit runs local."""
    C, r = run
    out = [res for res in r.results if res.attention == "nsa"]
    local = len(PAGE_SIZES) * len(POLICIES) + 4 + TIES_REPEATS[C]
    assert len(out) == local + (len(PAGE_SIZES) * len(POLICIES) + 4) * (C in SHARED_CS)
    return out


def topk_k(name: str) -> int:
    return 4096 if name.endswith("nsa-all-keys") else 16 if name.endswith("nsa576") else NSA_TOPK


def skip_unless_shared(C: int) -> None:
    if C not in SHARED_CS:
        pytest.skip("shared-access cases run at C in {1, 2, 4}")


@pytest.mark.clause("C-NSA")
def test_nsa_matches_single_process_reference(run):
    """Every NSA case: output within 1e-5 of one process, and every top-k row (tokens x layers, prefill and
    decode) equal to the reference's except at near ties (k-th and (k+1)-th reference logits within 1e-6
    relative)."""
    for res in nsa_results(run):
        assert res.max_abs_err is not None and res.max_abs_err <= TOL, (res.name, res.max_abs_err)
        assert np.isfinite(res.hidden()).all()
        rows, mismatched, near = res.topk_counts()
        layers = res.forwards[0].topk.shape[1]
        decoded = sum(len(d.request_ids) * d.steps for d in res.decodes)
        assert rows == (sum(sum(f.extend_lens) for f in res.forwards) + decoded) * layers
        assert mismatched == near, (res.name, mismatched, near)


@pytest.mark.clause("C-NSA")
def test_topk_rows_follow_the_rules(run):
    """Each token's selected positions: min(k, p + 1) distinct positions <= p, ascending, then -1 up to k.
    Every case has rows that select (more than k visible keys) and rows that pad (fewer)."""
    for res in nsa_results(run):
        k = topk_k(res.name)
        padded = selected = 0
        rows = [
            (
                np.concatenate(
                    [np.arange(L0, L0 + E) for L0, E in zip(f.prefix_lens, f.extend_lens, strict=True)]
                ),
                f.topk,
            )
            for f in res.forwards
        ]
        for d in res.decodes:  # step j of request i is at position prompt_len + j
            rows += [(np.asarray(d.prompt_lens) + j, d.topk[j]) for j in range(d.steps)]
        for pos, topk in rows:  # topk [N, layers, k]
            layers = topk.shape[1]
            assert topk.shape == (pos.shape[0], layers, k)
            count = np.minimum(k, pos + 1)
            for layer in range(layers):
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
        if not res.name.endswith("nsa-all-keys"):
            assert selected > 0, res.name


@pytest.mark.clause("C-ESTIMATE")
@pytest.mark.clause("C-NSA")
@pytest.mark.clause("C-MERGE")
def test_measured_logits_equal_the_estimate(run):
    """On every forward of every NSA case, every rank materialised, in every layer, exactly the elements
    that the independent oracle (tests/oracle.py) predicts: mqa_logits_elements under ``shared``; under
    ``local`` the (b - a) x (own keys < b) blocks of docs/distributed.md, whose sum over the ranks is
    C-ESTIMATE's total; and under ``local`` in every decode step, 1 x (own keys <= p) per request."""
    C, r = run
    for k, res in enumerate(r.results):
        if res.attention != "nsa":
            continue
        P = res.page_size
        for f in res.forwards:
            shared = oracle.mqa_logits_elements(
                f.prefix_lens, f.extend_lens, C, P, head_owners=f.head_owners, phases=f.phases
            )
            want = shared
            if res.kv_access == "local":
                want = oracle.local_mqa_logits_elements(
                    f.prefix_lens,
                    f.extend_lens,
                    C,
                    P,
                    f.page_lanes,
                    head_owners=f.head_owners,
                    phases=f.phases,
                )
                assert sum(want) == sum(shared)
            layers = len(f.logits_measured[0])
            assert f.logits_estimated == want, (res.name, f.index)
            assert f.logits_measured == [[w] * layers for w in want], (res.name, f.index)
            # Every rank recorded the same gathered counts.
            assert all(o.result[k].forwards[f.index].logits_measured == f.logits_measured for o in r.outcomes)
        for d in res.decodes:  # step j of a request with an L-token prompt: its query at position L + j
            for j in range(d.steps):
                if res.kv_access == "local":  # each rank: its own keys at positions <= L + j
                    want = [
                        sum(
                            sum(1 for s in range(L + j + 1) if lanes[s // P] == rank)
                            for L, lanes in zip(d.prompt_lens, d.page_lanes, strict=True)
                        )
                        for rank in range(C)
                    ]
                else:  # the token's owner: one (L + j + 1)-key row
                    want = [
                        sum(
                            L + j + 1
                            for L, lanes in zip(d.prompt_lens, d.token_lanes, strict=True)
                            if lanes[j] == rank
                        )
                        for rank in range(C)
                    ]
                assert d.logits_measured[j] == [[w] * len(d.logits_measured[j][0]) for w in want], res.name
        assert res.logits_match is True


@pytest.mark.clause("C-ESTIMATE")
def test_phase_zero_estimate_undersizes_a_rotated_rank(run):
    """An estimate that assumes phase 0 (the legacy plan, same head owners) is below what a rotated rank
    really materialised in some forward: the reason the estimator uses each request's own phase."""
    C, r = run
    skip_unless_shared(C)
    short = []
    for res in r.results:
        if res.attention != "nsa" or res.policy == "legacy" or res.kv_access != "shared":
            continue
        for f in res.forwards:
            phase0 = oracle.mqa_logits_elements(
                f.prefix_lens, f.extend_lens, C, res.page_size, head_owners=f.head_owners, policy="legacy"
            )
            measured = [row[0] for row in f.logits_measured]
            short += [(res.name, f.index, rank) for rank in range(C) if measured[rank] > phase0[rank]]
    if C == 1:
        assert short == []  # one rank: every phase is 0
    else:
        assert short, "no forward where a phase-0 estimate under-sizes a rank"


@pytest.mark.clause("C-NSA")
def test_topk_above_every_visible_key_is_dense_attention(run):
    """With k larger than every visible key each row keeps all its keys (padded with -1), so sparse MLA
    must reproduce dense MLA: the NSA model has the dense model's weights plus its indexer (under ``local``
    too, where the sparse path merges partials of selected keys and the dense one of every key; the
    decoded tokens agree as well)."""
    for prefix in ["", "local-"][(run[0] not in SHARED_CS) :]:
        sparse, dense = by_name(run, f"{prefix}nsa-all-keys"), by_name(run, f"{prefix}P16-rotation")
        np.testing.assert_allclose(sparse.hidden(), dense.hidden(), rtol=0, atol=TOL)
        assert [d.tokens for d in sparse.decodes] == [d.tokens for d in dense.decodes]


@pytest.mark.clause("C-NSA")
@pytest.mark.clause("C-RELOAD")
def test_index_k_pages_reload_with_latent_pages(run):
    """After a flush to the host tier, wave 2 loads its prefix pages back on their recorded lanes: the
    owner rank restores the page's index-K rows with its latent rows (a missing index row would read
    the NaN guard or a stale key and change the top-k); the result still equals the reference."""
    for name in ["nsa-reload"] * (run[0] in SHARED_CS) + ["local-nsa-reload"]:
        res = by_name(run, name)
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
    skip_unless_shared(C)
    res = by_name(run, "nsa-unequal-lanes")
    caps = tight_lanes(C, 16)
    assert res.pages_per_lane == caps
    if C > 1:
        assert len(set(caps)) > 1
    assert all(u <= q for u, q in zip(res.lane_pages_used, caps, strict=True))
    assert any(u == q for u, q in zip(res.lane_pages_used, caps, strict=True))
    assert res.max_abs_err <= TOL and res.logits_match is True
