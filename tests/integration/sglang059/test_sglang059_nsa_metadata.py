"""Differential tests: ``cpkv.integrations.sglang_cp.nsa_metadata`` against SGLang 0.5.9's own
``prepare_input_dp_with_cp_dsa`` (``sglang/srt/layers/attention/nsa/utils.py``, imported from the installed
0.5.9 wheel in ``.venv-sglang059``), and 0.5.9's own split and all-gather rerange run on cpkv's metadata.

What is stubbed (each with ``monkeypatch``, for the test only; torchvision by the conftest):
- ``is_nsa_prefill_cp_round_robin_split()`` returns False: SGLang reads the CP mode from its global server
  args, which these tests do not build; False selects the in-seq-split (zigzag) path, whose metadata this is;
- ``torch.Tensor.to(device="cuda")`` goes to the CPU: ``prepare_input_dp_with_cp_dsa`` moves its four
  ``*_tensor`` fields to "cuda", and this machine has none;
- the CP group's all-gather, ``get_attention_cp_group()``, is ``FakeCPGroup`` (one process holding every
  rank's shard); ``use_symmetric_memory`` is a no-op context and ``is_allocation_symmetric()`` False.
Everything else is SGLang 0.5.9's code. Seeded loops, at least 500 random requests per test.
"""

import contextlib
import importlib.metadata
import importlib.util
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from cpkv import CPConfig, plan_batch
from cpkv.integrations import sglang_cp
from sglang_cp_cases import (
    PAGE_SIZES,
    FakeCPGroup,
    all_gather_buffer,
    assert_all_fields_same,
    assert_same,
    random_case,
)

nsa = pytest.importorskip("sglang.srt.layers.attention.nsa.utils", reason="SGLang 0.5.9 (make test-sglang)")
if importlib.metadata.version("sglang") != "0.5.9":
    pytest.skip("needs SGLang 0.5.9 (.venv-sglang059)", allow_module_level=True)

pytestmark = pytest.mark.sglang

CASES = 600
PER_RANK = (
    "zigzag_index",
    "kv_len_prev",
    "kv_len_next",
    "actual_seq_q_prev",
    "actual_seq_q_next",
    "kv_len_prev_tensor",
    "kv_len_next_tensor",
    "actual_seq_q_prev_tensor",
    "actual_seq_q_next_tensor",
)


@pytest.fixture
def sglang059(monkeypatch):
    """SGLang 0.5.9's nsa utils with the stubs of the module docstring."""
    monkeypatch.setattr(nsa, "is_nsa_prefill_cp_round_robin_split", lambda: False)
    to = torch.Tensor.to

    def to_cpu_for_cuda(self, *args, **kwargs):
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_cpu_for_cuda)
    monkeypatch.setattr(nsa, "use_symmetric_memory", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(nsa, "is_allocation_symmetric", lambda: False)
    return types.SimpleNamespace(utils=nsa, monkeypatch=monkeypatch)


def sglang_metadata(C: int, rank: int, prefix_len: int, extend_len: int):
    """0.5.9's metadata as ``DeepseekV2ForCausalLM.forward`` builds it (``len(input_ids)``, seq_lens)."""
    return nsa.prepare_input_dp_with_cp_dsa(extend_len, rank, C, [prefix_len + extend_len])


def one_request(rng, page_size: int = 1):
    case = random_case(rng, page_size=page_size, max_bs=1)
    return case, case.cp_size, case.prefix_lens[0], case.extend_lens[0]


@pytest.mark.clause("C-ZIGZAG")
def test_legacy_fields_equal_sglang_059_byte_for_byte(sglang059):
    """page_size 1, ``legacy``, one request: every field on every rank equal (type, dtype, device, value)."""
    rng = np.random.default_rng(59)
    for _ in range(CASES):
        case, C, L0, E = one_request(rng)
        plan = plan_batch([L0], [E], CPConfig(C, 1, "legacy"))
        for r in range(C):
            ours = sglang_cp.nsa_metadata(plan, r)
            assert_all_fields_same(ours, sglang_metadata(C, r, L0, E), case, r)
            assert ours.request_phases == [0]


@pytest.mark.clause("C-PHASE")
@pytest.mark.clause("C-KERNEL")
def test_rotated_fields_equal_sglang_059s_with_ranks_rotated_by_phase(sglang059):
    """page_size 1, ``rotation`` and ``balanced`` (any phase): rank r's fields are SGLang's rank
    ``(r - phase) % C``'s; the rank-ordered lists are SGLang's rotated by the phase."""
    rng = np.random.default_rng(591)
    for n in range(CASES):
        case, C, L0, E = one_request(rng)
        policy = ("rotation", "balanced")[n % 2]
        phases = [int(rng.integers(0, C))] if policy == "balanced" else None
        plan = plan_batch([L0], [E], CPConfig(C, 1, policy), phases=phases)
        f = int(plan.request_phases[0])
        legacy = [sglang_metadata(C, r, L0, E) for r in range(C)]
        for r in range(C):
            ours, theirs = sglang_cp.nsa_metadata(plan, r), legacy[(r - f) % C]
            for name in PER_RANK:
                assert_same(getattr(ours, name), getattr(theirs, name), f"{case} phase {f} rank {r}: {name}")
            for name in ("split_list", "max_rank_len", "total_seq_lens"):
                assert_same(getattr(ours, name), getattr(theirs, name), f"{case} rank {r}: {name}")
            assert ours.per_rank_actual_token == np.roll(theirs.per_rank_actual_token, f).tolist(), case
            assert ours.reverse_split_len == np.roll(theirs.reverse_split_len, 2 * f).tolist(), case
            assert (
                ours.cp_reverse_index == ((np.array(theirs.cp_reverse_index) + 2 * f) % (2 * C)).tolist()
            ), case
            assert ours.request_phases == [f]


def gather059(sglang059, shards, C: int, rank: int, meta):
    """SGLang 0.5.9's ``cp_all_gather_rerange_output`` of ``rank``'s shard over ``FakeCPGroup``."""
    sglang059.monkeypatch.setattr(nsa, "get_attention_cp_group", lambda: FakeCPGroup(shards, rank))
    return nsa.cp_all_gather_rerange_output(
        shards[rank], C, types.SimpleNamespace(nsa_cp_metadata=meta), None
    )


@pytest.mark.clause("C-GATHER")
@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
def test_sglang_059s_split_and_rerange_round_trip_on_cpkv_metadata(sglang059):
    """page_size 1, any phase: 0.5.9's ``cp_split_and_rebuild_data`` / ``_position`` give each rank the
    tokens it owns, as cpkv's ``shard_*`` do, and 0.5.9's rerange returns the flat order on every rank."""
    rng = np.random.default_rng(592)
    for _ in range(CASES):
        case, C, L0, E = one_request(rng)
        plan = plan_batch([L0], [E], CPConfig(C, 1, "balanced"), phases=[int(rng.integers(0, C))])
        x = torch.arange(E * 2, dtype=torch.float32).reshape(E, 2)
        positions = torch.arange(L0, L0 + E)
        metas = [sglang_cp.nsa_metadata(plan, r) for r in range(C)]
        batches = [types.SimpleNamespace(nsa_cp_metadata=m) for m in metas]
        shards = [nsa.cp_split_and_rebuild_data(b, x) for b in batches]
        for r in range(C):
            owned = torch.from_numpy(np.flatnonzero(plan.token_owner == r))
            assert torch.equal(shards[r], x[owned]), case
            assert torch.equal(shards[r], sglang_cp.shard_hidden_states(x, metas[r])), case
            pos = nsa.cp_split_and_rebuild_position(batches[r], positions)
            assert torch.equal(pos, positions[owned]), case
            assert torch.equal(pos, sglang_cp.shard_position_ids(positions, metas[r])), case
            assert torch.equal(gather059(sglang059, shards, C, r, metas[r]), x), f"{case}: rank {r}"
        assert np.array_equal(sglang_cp.rerange_index(metas[0]), plan.gather_index), case


@pytest.mark.clause("C-GATHER")
def test_sglang_059s_ceil_total_over_cp_buffer_is_short_for_pages_and_batches(sglang059):
    """SGLang 0.5.9 all-gathers ``ceil(total_seq_lens / C)`` rows a rank, which holds every rank only for
    its one-request token split. With page-aligned blocks (one request, P > 1) or a batch (cpkv's
    ``zigzag_metadata``, which 0.5.9's rerange reads as its own) a rank can compute more: there SGLang's
    all-gather fails (its inputs are not ``ceil`` rows), and cpkv's ``max_rank_len`` (pinned: the busiest
    rank) with ``gather_rerange`` returns the flat order. Where ``ceil`` does hold, SGLang's own rerange
    round-trips cpkv's metadata too."""
    rng = np.random.default_rng(593)
    short = fits = 0
    for n in range(CASES):
        batch = n % 2 == 1
        case = random_case(rng, page_size=1 if batch else PAGE_SIZES[n % 4], max_bs=3 if batch else 1)
        C, N = case.cp_size, sum(case.extend_lens)
        plan = plan_batch(case.prefix_lens, case.extend_lens, CPConfig(C, case.page_size, "rotation"))
        build = sglang_cp.zigzag_metadata if batch else sglang_cp.nsa_metadata
        metas = [build(plan, r) for r in range(C)]
        M = metas[0].max_rank_len[0]
        assert (
            metas[0].max_rank_len == [plan.max_rank_tokens] * C == [max(metas[0].per_rank_actual_token)] * C
        )
        x = torch.arange(N * 2, dtype=torch.float32).reshape(N, 2)
        shards = [sglang_cp.shard_hidden_states(x, m) for m in metas]
        assert torch.equal(sglang_cp.gather_rerange(all_gather_buffer(shards, M), metas[0]), x), case
        if M > -(-N // C):
            short += 1
            with pytest.raises(ValueError, match="all_gather_into_tensor"):
                gather059(sglang059, shards, C, int(np.argmax(metas[0].per_rank_actual_token)), metas[0])
        else:
            fits += 1
            assert torch.equal(gather059(sglang059, shards, C, n % C, metas[n % C]), x), case
    assert short > CASES // 10 and fits > CASES // 10, (short, fits)


@pytest.mark.clause("C-ZIGZAG")
def test_sglang_059s_indexer_query_split_holds_only_for_its_token_split(sglang059):
    """0.5.9's indexer splits a rank's queries into its prev and next block at ``(n + 1) // 2``
    (``nsa_indexer.py``), true of its token split (the two blocks differ by at most one token) but not of
    page-aligned blocks: there the prev block is ``actual_seq_q_prev`` rows (pinned), which a CP indexer
    must split at."""
    source = Path(importlib.util.find_spec("sglang.srt.layers.attention.nsa.nsa_indexer").origin).read_text()
    assert "torch.split(\n                        q_fp8, (q_fp8.shape[0] + 1) // 2, dim=0" in source
    rng = np.random.default_rng(594)
    differs = 0
    for n in range(CASES):
        page_size = (1, *PAGE_SIZES)[n % 5]
        case, C, L0, E = one_request(rng, page_size)
        plan = plan_batch([L0], [E], CPConfig(C, page_size, "rotation"))
        for r in range(C):
            m = sglang_cp.nsa_metadata(plan, r)
            rows = m.actual_seq_q_prev + m.actual_seq_q_next
            assert rows == m.per_rank_actual_token[r], case
            assert m.actual_seq_q_prev == m.split_list[m.zigzag_index[0]], case
            if page_size == 1:
                assert m.actual_seq_q_prev == (rows + 1) // 2, case
            differs += m.actual_seq_q_prev != (rows + 1) // 2
    assert differs > 0
