"""Differential tests: ``cpkv.integrations.sglang_cp.zigzag_metadata`` against SGLang 0.5.23's own
``ZigzagCPStrategy.build_metadata`` (``sglang/srt/layers/cp/zigzag.py``), and SGLang's own shard and
gather code run on cpkv's metadata.

What stands in for SGLang's runtime (nothing else is stubbed; torchvision is, by the conftest):
- ``cp_rank``, which SGLang reads from its runtime parallel context (``get_parallel().attn_cp_rank``), is
  given to the strategy directly (``ranked``);
- the CP group's all-gather (``get_parallel().attn_cp_group`` in zigzag.py) is ``FakeCPGroup``, one process
  holding every rank's shard; the padding step's ``get_parallel().attn_cp_size`` and active strategy are set
  to the test's group.
``build_metadata`` picks its tensors' device itself (no runtime here: CPU).

Seeded loops, at least 500 random batches per test (about a second each).
"""

import types

import numpy as np
import pytest
import torch

from sglang_cp_cases import (
    PAGE_SIZES,
    FakeCPGroup,
    all_gather_buffer,
    assert_all_fields_same,
    assert_same,
    on_rank,
    random_case,
)

pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
zigzag = pytest.importorskip("sglang.srt.layers.cp.zigzag")
cp_base = pytest.importorskip("sglang.srt.layers.cp.base")
cp_padding = pytest.importorskip("sglang.srt.layers.cp.padding")

from cpkv import CPConfig, plan_batch  # noqa: E402
from cpkv.integrations import sglang_cp  # noqa: E402

pytestmark = pytest.mark.sglang

CASES = 600
PER_REQUEST_LISTS = (
    "kv_len_prev_list",
    "kv_len_next_list",
    "actual_seq_q_prev_list",
    "actual_seq_q_next_list",
)
PER_REQUEST_TENSORS = {  # tensor -> the list it holds, per request: [B] (prev or next) or [2B] (prev then next)
    "kv_len_prev_tensor": "kv_len_prev_list",
    "kv_len_next_tensor": "kv_len_next_list",
    "actual_seq_q_prev_tensor": "actual_seq_q_prev_list",
    "actual_seq_q_next_tensor": "actual_seq_q_next_list",
}


def ranked(cp_size: int, rank: int):
    return on_rank(zigzag.ZigzagCPStrategy, cp_size, rank)


def sglang_metadata(C: int, rank: int, prefix: list[int], extend: list[int]):
    """SGLang's metadata as ``prepare_cp_forward`` builds it: seq_lens = prefix + extend."""
    seq = [p + e for p, e in zip(prefix, extend, strict=True)]
    return ranked(C, rank).build_metadata(num_tokens=sum(extend), seqs_len=seq, extend_seqs_len=list(extend))


@pytest.mark.clause("C-ZIGZAG")
@pytest.mark.clause("C-BATCH")
def test_legacy_fields_equal_sglang_byte_for_byte():
    """page_size 1, ``legacy``: every field SGLang builds, on every rank, equal (type, dtype, device, value)."""
    rng = np.random.default_rng(523)
    for _ in range(CASES):
        case = random_case(rng)
        plan = plan_batch(case.prefix_lens, case.extend_lens, CPConfig(case.cp_size, 1, "legacy"))
        for r in range(case.cp_size):
            ours = sglang_cp.zigzag_metadata(plan, r)
            assert_all_fields_same(
                ours, sglang_metadata(case.cp_size, r, case.prefix_lens, case.extend_lens), case, r
            )
            assert ours.request_phases == [0] * len(case.extend_lens)


@pytest.mark.clause("C-ZIGZAG")
@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
def test_page_aligned_blocks_are_sglangs_zigzag_over_pages():
    """P > 1, ``legacy``: SGLang splits tokens, which would cut a page between two ranks; cpkv's blocks are
    SGLang's own zigzag split of the request's pages (build_metadata run on page counts), each block the
    tokens of its pages (the last page as far as the extend goes), and every rank's rows are the tokens
    whose pages it owns."""
    rng = np.random.default_rng(5230)
    for n in range(CASES):
        case = random_case(rng, page_size=PAGE_SIZES[n % len(PAGE_SIZES)])
        C, P, B, S = case.cp_size, case.page_size, len(case.extend_lens), 2 * case.cp_size
        L0, E = np.array(case.prefix_lens), np.array(case.extend_lens)
        plan = plan_batch(L0, E, CPConfig(C, P, "legacy"))
        pages = (-(-E // P)).tolist()
        for r in range(C):
            ours = sglang_cp.zigzag_metadata(plan, r)
            theirs = sglang_metadata(C, r, (L0 // P).tolist(), pages)  # in pages
            ends = np.minimum(np.cumsum(np.reshape(theirs.split_list, (B, S)), axis=1) * P, E[:, None])
            tokens = np.diff(ends, axis=1, prepend=0).ravel()  # [B*2C] tokens of SGLang's page blocks
            assert ours.split_list == tokens.tolist(), case
            assert ours.zigzag_index == theirs.zigzag_index, case
            assert ours.cp_reverse_index == theirs.cp_reverse_index, case
            chunk_tokens = np.empty(B * S, dtype=np.int64)
            chunk_tokens[theirs.cp_reverse_index] = tokens
            assert ours.reverse_split_len == chunk_tokens.tolist(), case
            assert (
                ours.per_rank_actual_token
                == chunk_tokens.reshape(C, 2 * B).sum(axis=1).tolist()
                == (plan.per_rank_tokens.tolist())
            ), case
            assert ours.max_rank_len == [plan.max_rank_tokens] * C
            for half in ("prev", "next"):
                kv_pages = np.array(getattr(theirs, f"kv_len_{half}_list"))
                want = L0 + np.minimum(P * (kv_pages - L0 // P), E)  # tokens up to the block's last page
                assert getattr(ours, f"kv_len_{half}_list") == want.tolist(), case
                blocks = ours.zigzag_index[:B] if half == "prev" else ours.zigzag_index[B:]
                assert getattr(ours, f"actual_seq_q_{half}_list") == tokens[blocks].tolist()
            for name, values in PER_REQUEST_TENSORS.items():
                assert_same(getattr(ours, name), torch.tensor(getattr(ours, values), dtype=torch.int32), name)
            mine = sglang_cp.local_token_index(ours)
            assert np.array_equal(np.sort(mine), np.flatnonzero(plan.token_owner == r)), case


def rotated_expectation(case, plan):
    """Per rank, what SGLang's legacy metadata says once each request's blocks move to the ranks its phase
    gives: rank r computes for request i what SGLang's rank ``(r - f_i) % C`` computes."""
    C, B = case.cp_size, len(case.extend_lens)
    f = plan.request_phases.tolist()
    legacy = [sglang_metadata(C, r, case.prefix_lens, case.extend_lens) for r in range(C)]
    alone = [
        np.array(sglang_metadata(C, 0, [p], [e]).per_rank_actual_token)
        for p, e in zip(case.prefix_lens, case.extend_lens, strict=True)
    ]
    per_rank = sum(np.roll(a, fi) for a, fi in zip(alone, f, strict=True)).tolist()
    rsl0, rev0 = np.array(legacy[0].reverse_split_len), np.array(legacy[0].cp_reverse_index)
    k = np.arange(2 * B)
    fk = np.array(f)[k % B]
    reverse_split_len = np.concatenate([rsl0[((rho - fk) % C) * 2 * B + k] for rho in range(C)]).tolist()
    req = np.arange(B * 2 * C) // (2 * C)
    cp_reverse_index = ((rev0 // (2 * B) + np.array(f)[req]) % C * 2 * B + rev0 % (2 * B)).tolist()
    return legacy, f, per_rank, reverse_split_len, cp_reverse_index


@pytest.mark.clause("C-PHASE")
@pytest.mark.clause("C-KERNEL")
def test_rotated_fields_equal_sglangs_with_ranks_rotated_by_phase():
    """page_size 1, ``rotation`` and ``balanced`` (any phases, as the allocator picks them): each request's
    fields on rank r are SGLang's for rank ``(r - phase) % C``; the rank-ordered lists are SGLang's with each
    request's blocks moved to their ranks; for one request every per-rank field equals SGLang's, tensors too."""
    rng = np.random.default_rng(5231)
    for n in range(CASES):
        case = random_case(rng)
        C, B = case.cp_size, len(case.extend_lens)
        policy = ("rotation", "balanced")[n % 2]
        phases = rng.integers(0, C, B).tolist() if policy == "balanced" else None
        plan = plan_batch(case.prefix_lens, case.extend_lens, CPConfig(C, 1, policy), phases=phases)
        legacy, f, per_rank, reverse_split_len, cp_reverse_index = rotated_expectation(case, plan)
        for r in range(C):
            ours = sglang_cp.zigzag_metadata(plan, r)
            src = [
                legacy[(r - fi) % C] for fi in f
            ]  # per request, SGLang's rank whose blocks rank r computes
            assert ours.request_phases == f and ours.split_list == legacy[0].split_list
            want = [src[i].zigzag_index[h * B + i] for h in (0, 1) for i in range(B)]
            assert ours.zigzag_index == want, case
            for name in PER_REQUEST_LISTS:
                assert getattr(ours, name) == [getattr(src[i], name)[i] for i in range(B)], (case, r, name)
            for name in PER_REQUEST_TENSORS:
                want = torch.stack([getattr(src[i], name)[i] for i in range(B)])
                assert_same(getattr(ours, name), want, f"{case} rank {r} {name}")
            assert ours.per_rank_actual_token == per_rank and ours.max_rank_len == [max(per_rank)] * C, case
            assert ours.reverse_split_len == reverse_split_len, case
            assert ours.cp_reverse_index == cp_reverse_index, case
            if B == 1:  # one request: the rank's whole view is SGLang's rank (r - f) % C
                for name in (
                    "kv_len_combined_tensor",
                    "cu_seqlens_q_combined_tensor",
                    "cu_seqlens_kv_combined_tensor",
                    "cu_seqlens_q_prev_tensor",
                    "cu_seqlens_kv_next_tensor",
                    "total_q_prev_tokens",
                    "total_q_next_tokens",
                    "max_seqlen_q_prev",
                    "max_seqlen_q_next",
                    "max_seqlen_q_combined",
                ):
                    assert_same(getattr(ours, name), getattr(src[0], name), f"{case} rank {r} {name}")


def shard_and_gather(monkeypatch, plan, C: int, padded: bool):
    """Every rank's metadata, then SGLang's own shard of hidden states and positions and its own gather
    (through ``FakeCPGroup``), and cpkv's functions on the same metadata; returns what each gave."""
    N = plan.num_tokens
    x = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
    first = np.repeat(plan.prefix_lens - plan.extend_indptr[:-1], plan.extend_lens)  # position - flat index
    positions = torch.from_numpy(first) + torch.arange(N)
    metas = [sglang_cp.zigzag_metadata(plan, r) for r in range(C)]
    if padded:  # SGLang's step that pads every rank to a multiple of 2C rows
        monkeypatch.setattr(cp_padding, "get_parallel", lambda: types.SimpleNamespace(attn_cp_size=C))
        monkeypatch.setattr(cp_base, "_STRATEGY", ranked(C, 0))
        for m in metas:
            cp_padding.pad_logical_token_to_physical(m)
    batches = [types.SimpleNamespace(attn_cp_metadata=m) for m in metas]
    shards = [ranked(C, r).shard_hidden_states(x, batches[r]) for r in range(C)]
    logical = [s[: len(sglang_cp.local_token_index(m))] for s, m in zip(shards, metas, strict=True)]
    gathered = []
    for r in range(C):
        group = FakeCPGroup(logical, r)  # SGLang gathers each rank's logical rows (its padding cut off)
        monkeypatch.setattr(
            zigzag, "get_parallel", lambda group=group: types.SimpleNamespace(attn_cp_group=group)
        )
        gathered.append(ranked(C, r).gather_hidden_states(shards[r], batches[r]))
    return x, positions, metas, batches, logical, gathered


@pytest.mark.clause("C-GATHER")
@pytest.mark.clause("C-KERNEL")
@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
def test_sglangs_shard_and_gather_round_trip_on_cpkv_metadata(monkeypatch):
    """Rotated page-aligned plans: SGLang's shard gives each rank exactly the tokens it owns (cpkv's
    ``shard_*`` give the same rows and positions), SGLang's all-gather rerange returns the flat order on
    every rank, as does cpkv's ``gather_rerange`` of the all-gather buffer; for one request cpkv's rerange
    is the plan's ``gather_index``. Also after SGLang pads every rank to a multiple of 2C rows."""
    rng = np.random.default_rng(5232)
    for n in range(CASES):
        case = random_case(rng, page_size=(1, *PAGE_SIZES)[n % 5], max_bs=3)
        C, B = case.cp_size, len(case.extend_lens)
        config = CPConfig(C, case.page_size, "balanced")
        plan = plan_batch(case.prefix_lens, case.extend_lens, config, phases=rng.integers(0, C, B).tolist())
        x, positions, metas, batches, shards, gathered = shard_and_gather(
            monkeypatch, plan, C, padded=n % 2 == 1
        )
        M = metas[0].max_rank_len[0]
        for r in range(C):
            mine = sglang_cp.local_token_index(metas[r])
            assert np.array_equal(np.sort(mine), np.flatnonzero(plan.token_owner == r)), case
            assert torch.equal(shards[r], x[torch.from_numpy(mine)]), case
            assert torch.equal(shards[r], sglang_cp.shard_hidden_states(x, metas[r])), case
            sgl_pos = ranked(C, r).shard_position_ids(positions, batches[r])[: len(mine)]
            assert torch.equal(sgl_pos, sglang_cp.shard_position_ids(positions, metas[r])), case
            assert torch.equal(gathered[r], x), f"{case}: SGLang's gather on rank {r}"
            if B == 1:
                assert np.array_equal(mine, np.flatnonzero(plan.token_owner == r))  # ascending flat order
        buffer = all_gather_buffer(shards, M)
        assert torch.equal(sglang_cp.gather_rerange(buffer, metas[0]), x), case
        if B == 1 and n % 2 == 0:
            assert np.array_equal(sglang_cp.rerange_index(metas[0]), plan.gather_index), case


@pytest.mark.clause("C-GATHER")
def test_the_all_gather_buffer_is_the_busiest_rank_not_ceil_total_over_cp():
    """SGLang 0.5.23 and cpkv size each rank's all-gather buffer ``max(per_rank_actual_token)`` rows. SGLang
    0.5.9 sized it ``ceil(total / C)`` (``cp_attn_tp_all_gather_reorganazied_into_tensor``), which holds only
    for its one-request token split: a batch (C=2, E=[5, 5]: rank 0 computes 3 + 3 = 6 > 5) or page-aligned
    blocks (C=2, P=4, E=20: rank 0 computes 8 + 4 = 12 > 10) overflow it. cpkv's value is pinned here."""
    short = 0
    rng = np.random.default_rng(5233)
    for n in range(CASES):
        case = random_case(rng, page_size=(1, *PAGE_SIZES)[n % 5])
        C, E = case.cp_size, case.extend_lens
        plan = plan_batch(case.prefix_lens, E, CPConfig(C, case.page_size, "rotation"))
        ours = sglang_cp.zigzag_metadata(plan, 0)
        assert ours.max_rank_len == [plan.max_rank_tokens] * C == [max(plan.per_rank_tokens.tolist())] * C
        short += plan.max_rank_tokens > -(-sum(E) // C)
    assert short > CASES // 10, short  # the ceil(total / C) buffer is short that often
    for C, P, E, M in ((2, 1, [5, 5], 6), (2, 4, [20], 12)):
        plan = plan_batch([0] * len(E), E, CPConfig(C, P, "legacy"))
        assert sglang_cp.zigzag_metadata(plan, 0).max_rank_len == [M, M] and -(-sum(E) // C) < M
