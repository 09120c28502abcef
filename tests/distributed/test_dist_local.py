"""Owner lanes without a shared view (SPEC C-MERGE), on C real processes for C in {1, 2, 3, 4}.

The ``local-`` cases of ``matrix.cases_for`` (dense and NSA, page_size {1, 16, 64} x every policy, MHA,
DeepSeek widths, a host-tier reload, integer index logits run repeatedly) prefill under
``kv_access = local`` and decode greedily after every prompt; two ``decode-`` twins decode the same
workloads under ``shared``. Checked here: prefill and decode against the single-process reference, that
no rank holds another lane's rows, that both access modes decode the same tokens, that the decoded
requests' pages lie on every lane and each decode token is computed by its page's owner, that the
global top-k is the same on every rank and in every run of a tie-heavy case, and that the bytes each
rank exchanged follow the formulas of docs/distributed.md.
"""

import numpy as np
import pytest
import torch
from matrix import NSA_TIES, PAGE_SIZES, POLICIES, TIES_REPEATS, by_name, cases_for

from cpkv.executor import TinyDecoder

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600), pytest.mark.clause("C-MERGE")]

TOL = 1e-5


def local_results(run) -> list:
    _, r = run
    return [res for res in r.results if res.kv_access == "local"]


def test_local_matrix_matches_the_reference_in_prefill_and_decode(run):
    """Every local case: every prefill forward and decode step within 1e-5 of one process, every decoded
    token the reference's greedy choice, every request of the workload decoded once, the top-k rows equal
    to the reference's except at near ties, measured logits == the local formula."""
    C, _ = run
    cases = {c.name: c for c in cases_for(C)}
    results = local_results(run)
    names = {res.name for res in results}
    assert {f"local-{k}P{P}-{pol}" for k in ("", "nsa-") for P in PAGE_SIZES for pol in POLICIES} <= names
    for res in results:
        case = cases[res.name]
        assert res.kv_buffer == "local" and res.unwritten_rows_intact is True, res.name
        assert res.max_abs_err <= TOL and res.tokens_match is True, (res.name, res.max_abs_err)
        decoded = sorted(rid for d in res.decodes for rid in d.request_ids)
        assert decoded == list(range(len(case.workload.requests))), res.name
        for d in res.decodes:
            assert d.steps == case.decode_steps and d.max_abs_err <= TOL and d.logits_max_abs_err <= 10 * TOL
            assert d.tokens == d.reference_tokens and all(len(t) == d.steps for t in d.tokens)
            assert d.per_rank_tokens == np.bincount(np.ravel(d.token_lanes), minlength=C).tolist()
        if res.attention == "nsa":
            rows, mismatched, near = res.topk_counts()
            assert rows > 0 and mismatched == near and res.logits_match is True, res.name


def test_no_rank_holds_another_lanes_rows(run):
    """Under local every rank's pools are one lane (Q*P rows per layer; a shared view has C*Q*P), and in
    the audited cases each rank's every write, decode steps included, changed only its own tokens' rows."""
    C, r = run
    audited = {c.name for c in cases_for(C) if c.audit_writes and c.kv_access == "local"}
    for outcome in r.outcomes:
        for res in outcome.result:
            lane = max(res.pages_per_lane) * res.page_size
            pools = {"latent", "index_k"} if res.attention == "nsa" else {"latent"}
            want = lane if res.kv_access == "local" else C * lane
            assert res.pool_rows == dict.fromkeys(pools, want), (res.name, res.pool_rows)
            if res.name in audited:
                steps = {a.forward for a in res.audits}
                assert {d.first_index + j for d in res.decodes for j in range(d.steps)} <= steps
                assert all(
                    (a.rows_outside_lane, a.rows_unexpected, a.rows_misread) == (0, 0, 0) for a in res.audits
                )


def test_both_access_modes_decode_the_same_tokens(run):
    """The same workload and policy under shared (reads through the view) and local (merges partials):
    identical generated tokens and pages, prefill and decode hidden states within 1e-5."""
    for name in ("P16-rotation", "nsa-P16-rotation"):
        shared, local = by_name(run, f"decode-{name}"), by_name(run, f"local-{name}")
        assert shared.kv_access == "shared" and shared.tokens_match is True
        assert [d.tokens for d in shared.decodes] == [d.tokens for d in local.decodes]
        assert [d.page_lanes for d in shared.decodes] == [d.page_lanes for d in local.decodes]
        np.testing.assert_allclose(shared.hidden(), local.hidden(), rtol=0, atol=TOL)
        for a, b in zip(shared.decodes, local.decodes, strict=True):
            np.testing.assert_allclose(a.hidden, b.hidden, rtol=0, atol=TOL)


def test_decode_after_prefill_reads_pages_on_every_lane(run):
    """Some decoded request holds pages on every lane, so each decode step merges a partial from every
    rank; every decode token was computed by the owner of its page (C-OWNER-EQ-COMPUTE)."""
    C, _ = run
    every_lane = 0
    for res in local_results(run):
        P = res.page_size
        for d in res.decodes:
            for L, lanes, token_lanes in zip(d.prompt_lens, d.page_lanes, d.token_lanes, strict=True):
                assert token_lanes == [lanes[(L + j) // P] for j in range(d.steps)], res.name
                every_lane += set(lanes) == set(range(C))
    assert every_lane > 0


@pytest.mark.clause("C-NSA")
def test_topk_identical_across_repeated_runs_with_integer_logits(run):
    """Integer index logits (rows tie often): every run of the case (20 at C=3) selects the same rows, on
    every rank (the same digest), and none differs from the reference, ties included."""
    C, r = run
    k0 = next(k for k, res in enumerate(r.results) if res.name == "local-nsa-ties-0")
    runs = [res for res in r.results if res.name.startswith("local-nsa-ties-")]
    assert len(runs) == TIES_REPEATS[C]
    for res in runs:
        assert res.topk_counts()[1] == 0 and res.max_abs_err <= TOL
        for f, f0 in zip(res.forwards, runs[0].forwards, strict=True):
            assert np.array_equal(f.topk, f0.topk) and f.topk_digest == f0.topk_digest
        for d, d0 in zip(res.decodes, runs[0].decodes, strict=True):
            assert np.array_equal(d.topk, d0.topk) and d.tokens == d0.tokens
    for o in r.outcomes:
        assert [f.topk_digest for f in o.result[k0].forwards] == [f.topk_digest for f in runs[0].forwards]
    # The reference's own rows: a large share of the rows that must choose (more than k visible keys) tie.
    model = TinyDecoder(NSA_TIES)
    case = next(c for c in cases_for(C) if c.name == "local-nsa-ties-0")
    tied = choosing = 0
    for tokens in case.workload.requests:
        ref = model.reference(torch.tensor(tokens))
        choosing += int((torch.arange(len(tokens)) + 1 > NSA_TIES.index_topk).sum())
        tied += int(ref.near_tie.sum())
    assert tied >= 0.3 * choosing > 0


def expected_comm(model, C, prefix_lens, extend_lens, per_rank) -> dict:
    """Bytes per rank and kind over all layers, from docs/distributed.md (float32 rows; a top-k candidate
    is a float32 logit and an int32 position)."""
    c = model
    mla = c.kv_mode == "mla"
    q_row = 4 * c.num_heads * (c.kv_lora_rank + c.rope_dim if mla else c.head_dim)
    if c.attention == "nsa":
        q_row += 4 * (c.index_heads * c.index_head_dim + c.index_heads)
    p_row = 4 * c.num_heads * ((c.kv_lora_rank if mla else c.head_dim) + 1)
    N, Lyr = sum(extend_lens), c.num_layers
    T = sum(E * min(c.index_topk, L0 + E) for L0, E in zip(prefix_lens, extend_lens, strict=True))
    t = Lyr * (C - 1) * T * 8 if c.attention == "nsa" else 0
    return {
        "queries": {
            "sent": [Lyr * (C - 1) * n * q_row for n in per_rank],
            "recv": [Lyr * (N - n) * q_row for n in per_rank],
        },
        "partials": {
            "sent": [Lyr * (N - n) * p_row for n in per_rank],
            "recv": [Lyr * (C - 1) * n * p_row for n in per_rank],
        },
        "topk": {"sent": [t] * C, "recv": [t] * C},
    }


def test_comm_bytes_follow_the_formulas(run):
    """Per forward and decode step, each rank's bytes sent and received (counted on the tensors passed to
    the collectives) equal the formulas; under shared there is no such exchange."""
    C, r = run
    cases = {c.name: c for c in cases_for(C)}
    zero = {k: {"sent": [0] * C, "recv": [0] * C} for k in ("queries", "partials", "topk")}
    for res in r.results:
        model = cases[res.name].model
        steps = [(f.comm_bytes, f.prefix_lens, f.extend_lens, f.per_rank_tokens) for f in res.forwards]
        for d in res.decodes:
            for j in range(d.steps):
                lanes = [t[j] for t in d.token_lanes]
                steps.append(
                    (
                        d.comm_bytes[j],
                        [L + j for L in d.prompt_lens],
                        [1] * len(lanes),
                        [lanes.count(x) for x in range(C)],
                    )
                )
        for got, L0, E, per_rank in steps:
            want = expected_comm(model, C, L0, E, per_rank) if res.kv_access == "local" else zero
            assert got == want, (res.name, L0, E)
