"""Differential tests of cpkv's ``interleave`` strategy (C-INTERLEAVE) against SGLang 0.5.23's own code:

- placement: an interleave plan with ``phase = (b + ceil(L0 / P)) % C`` puts every new page on the lane
  that SGLang's page-sharded pool (``PageInterleavePoolAllocator``, ``srt/mem_cache/allocator/
  page_interleave.py``, run on the CPU) gives it, b being the chain's rotation base the pool resolves;
- metadata: ``cpkv.integrations.sglang_cp_interleave.interleave_metadata`` equals, field by field, the
  ``InterleaveContextParallelMetadata`` SGLang builds for the same owner of every row (its general form,
  ``DeepseekV4AttnBackend._late_layer_tail_cp_layout``), and at page_size 1 with phases ``cum_E % C`` the
  plan is SGLang's default interleave split (``InterleaveCPStrategy.build_metadata``, its shard);
- gather: SGLang's own all-gather rerange (``InterleaveCPStrategy.gather_hidden_states``) on cpkv's
  metadata returns every rank the batch in flat order.

What stands in for SGLang's runtime: the rank and CP group (``get_parallel()``), as in
test_sglang_cp_metadata.py, with ``FakeCPGroup`` holding every rank's rows in one process; symmetric memory
off. Seeded loops of a few hundred random batches each.
"""

import contextlib
import types

import numpy as np
import pytest
import torch

from sglang_cp_cases import PAGE_SIZES, FakeCPGroup, on_rank, random_case, round_robin_plan

pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
interleave = pytest.importorskip("sglang.srt.layers.cp.interleave")
page_interleave = pytest.importorskip("sglang.srt.mem_cache.allocator.page_interleave")
dsv4 = pytest.importorskip("sglang.srt.layers.attention.deepseek_v4_backend")

from cpkv import CPConfig, plan_batch  # noqa: E402
from cpkv.errors import PlanError  # noqa: E402
from cpkv.integrations.sglang_cp_interleave import interleave_metadata  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.clause("C-INTERLEAVE")]

CASES = 400


def config(C: int, P: int) -> CPConfig:
    return CPConfig(C, P, "rotation", "interleave")


def ranked(cp_size: int, rank: int):
    return on_rank(interleave.InterleaveCPStrategy, cp_size, rank)


def parallel(monkeypatch, module, C: int, rank: int, group=None) -> None:
    """``module.get_parallel()`` answers for ``rank`` of a C-rank group (``group``: its all-gather)."""
    ns = types.SimpleNamespace(attn_cp_size=C, attn_cp_rank=rank, attn_cp_group=group)
    monkeypatch.setattr(module, "get_parallel", lambda: ns)


# ----------------------------------------------------------------------------------------------------
# placement: PageInterleavePoolAllocator
# ----------------------------------------------------------------------------------------------------


def sglang_pool(C: int, P: int, pages_per_rank: int):
    """SGLang's page-sharded pool on the CPU: ``pages_per_rank`` physical pages a rank, C ranks."""
    return page_interleave.PageInterleavePoolAllocator(
        size=pages_per_rank * P,
        physical_page_size=P,
        shard_size=C,
        dtype=torch.bfloat16,
        device="cpu",
        kvcache=None,
        need_sort=False,
    )


@pytest.mark.clause("C-PHASE")
def test_interleave_plan_puts_every_page_where_sglangs_page_sharded_pool_does():
    """Random batches of chains (new ones, whose base the pool draws from its least-full class, and
    extensions of a chain of known base), several steps on one pool: for each request, the lane of every
    new page SGLang allocates (``loc // P % C``) is the owner cpkv's interleave plan gives it with
    ``phase = (b + L0 // P) % C``; so are the pool's per-class pops and the plan's pages per lane."""
    rng = np.random.default_rng(36)
    checked = 0
    for n in range(CASES // 4):
        C = int(rng.integers(2, 9))
        P = (1, *PAGE_SIZES)[n % 5]
        pool = sglang_pool(C, P, 4096)
        for _ in range(4):
            B = int(rng.integers(1, 5))
            L0 = (
                rng.integers(0, 30, B) * P * (rng.random(B) < 0.5)
            ).tolist()  # page-aligned, as SGLang asserts
            E = [int(rng.integers(1, rng.choice([2 * C, 6 * C * P]) + 1)) for _ in range(B)]
            bases = [None if rng.random() < 0.5 else int(rng.integers(0, C)) for _ in range(B)]
            before = pool.class_free_page_counts()
            t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
            seq = [a + b for a, b in zip(L0, E, strict=True)]
            locs = pool.alloc_extend(t(L0), t(L0), t(seq), t(seq), t([-1] * B), sum(E), rotation_bases=bases)
            assert locs is not None
            assert None not in bases  # the pool resolved each new chain's base in place
            phases = [(b + -(-x // P)) % C for b, x in zip(bases, L0, strict=True)]
            plan = plan_batch(L0, E, config(C, P), phases=phases)
            pages = locs.numpy() // P  # SGLang's logical page of every extend token (prefixes end on a page)
            assert ((pages % C) == plan.token_owner).all(), (C, P, L0, E, bases)  # C-OWNER-EQ-COMPUTE
            new_pages = pages[np.r_[True, pages[1:] != pages[:-1]]]  # each new page once, in order
            assert (new_pages % C).tolist() == plan.page_owners.tolist(), (C, P, L0, E, bases)
            taken = [a - b for a, b in zip(before, pool.class_free_page_counts(), strict=True)]
            assert taken == plan.new_pages_per_lane.tolist()
            checked += B
    assert checked > CASES // 2


def test_sglangs_class_counts_are_cpkvs_interleave_lane_pages():
    """``PageInterleavePoolAllocator._class_counts`` (pops per class of a cyclic run) is ``policy.lane_pages``
    under interleave, for every start class, page count and group size up to 8."""
    from cpkv.policy import lane_pages

    for C in range(2, 9):
        for start in range(C):
            for m in range(0, 4 * C + 2):
                theirs = page_interleave.PageInterleavePoolAllocator._class_counts(start, m, C)
                assert lane_pages(m, start, C, "interleave").tolist() == theirs, (C, start, m)


# ----------------------------------------------------------------------------------------------------
# metadata
# ----------------------------------------------------------------------------------------------------


def sglang_general_metadata(monkeypatch, plan, rank: int):
    """SGLang's ``_late_layer_tail_cp_layout`` for rows owned as in ``plan``: row t's token index is
    ``t * C + token_owner[t]`` (SGLang reads the owner as ``token_index % C``), positions from the plan."""
    C, N = plan.config.cp_size, plan.num_tokens
    parallel(monkeypatch, dsv4, C, rank)
    owner = torch.from_numpy(plan.token_owner.copy())
    token_indices = torch.arange(N, dtype=torch.int64) * C + owner
    batch = types.SimpleNamespace(
        batch_size=plan.num_requests, positions=torch.arange(N * C, dtype=torch.int64)
    )
    tail_lens = torch.from_numpy(plan.extend_lens.copy())
    return dsv4.DeepseekV4AttnBackend._late_layer_tail_cp_layout(None, batch, token_indices, tail_lens)


def test_metadata_equals_sglangs_for_the_same_row_owners(monkeypatch):
    """Every field, on every rank, equal to SGLang's (type, dtype, device, value), for random interleave
    plans (page sizes 1..64, explicit phases); and the rank's tail rows are its own tokens."""
    rng = np.random.default_rng(3601)
    for n in range(CASES):
        case = random_case(rng, page_size=(1, *PAGE_SIZES)[n % 5], max_bs=3)
        C, B = case.cp_size, len(case.extend_lens)
        if sum(case.extend_lens) == 0:
            continue
        plan = plan_batch(
            case.prefix_lens,
            case.extend_lens,
            config(C, case.page_size),
            phases=rng.integers(0, C, B).tolist(),
        )
        for r in range(C):
            theirs = sglang_general_metadata(monkeypatch, plan, r)
            ours = interleave_metadata(plan, r)
            names = [
                f.name for f in interleave.InterleaveContextParallelMetadata.__dataclass_fields__.values()
            ]
            assert list(ours.__dataclass_fields__) == names
            for name in names:
                a, b = getattr(ours, name), getattr(theirs["cp_metadata"], name)
                if isinstance(b, torch.Tensor):
                    assert a.dtype == b.dtype and a.device == b.device and torch.equal(a, b), (case, r, name)
                else:
                    assert type(a) is type(b) and a == b, (case, r, name)
            mine = np.flatnonzero(plan.token_owner == r)
            assert theirs["local_lens_cpu"] == plan.per_request_rank_tokens[:, r].tolist()
            assert torch.equal(theirs["local_token_indices"], torch.from_numpy(mine)), case


def test_page_size_1_with_phases_cum_e_is_sglangs_default_split(monkeypatch):
    """At P = 1 with phase ``cum_E[i] % C`` a cpkv interleave plan gives flat token t to rank ``t % C``:
    SGLang's ``build_metadata`` counts the same tokens per rank, its ``interleave_rows_per_request`` the same
    tokens per request and rank, and SGLang's own shard of hidden states holds exactly each rank's tokens."""
    rng = np.random.default_rng(3602)
    for _ in range(CASES):
        case = random_case(rng, max_bs=4)
        C, E = case.cp_size, case.extend_lens
        N = sum(E)
        if N == 0:
            continue
        plan = round_robin_plan(case)
        assert plan.token_owner.tolist() == (np.arange(N) % C).tolist(), case
        x = torch.arange(N * 2, dtype=torch.float32).reshape(N, 2)
        for r in range(C):
            strategy = ranked(C, r)
            theirs = strategy.build_metadata(num_tokens=N, seqs_len=None, extend_seqs_len=list(E))
            assert theirs.per_rank_actual_token == plan.per_rank_tokens.tolist(), case
            assert max(theirs.max_rank_len) == plan.max_rank_tokens
            batch = types.SimpleNamespace(attn_cp_metadata=theirs)
            mine = torch.from_numpy(np.flatnonzero(plan.token_owner == r))
            assert torch.equal(strategy.shard_hidden_states(x, batch), x[mine]), case
            ours = interleave_metadata(plan, r)
            assert ours.local_index[: len(mine)].tolist() == mine.tolist()
            rows = interleave.interleave_rows_per_request(list(E), r, C)  # SGLang's rows of each request
            assert rows == plan.per_request_rank_tokens[:, r].tolist(), case


def test_sglangs_gather_on_cpkv_metadata_restores_flat_order(monkeypatch):
    """Each rank holds its tokens' rows (``local_index``); SGLang's ``gather_hidden_states`` (the all-gather
    of C * M rows, then ``index_select`` by ``gather_index``) returns the batch in flat order on every rank."""
    monkeypatch.setattr(interleave, "use_symmetric_memory", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(interleave, "is_allocation_symmetric", lambda: True)
    rng = np.random.default_rng(3603)
    for n in range(CASES // 2):
        case = random_case(rng, page_size=(1, *PAGE_SIZES)[n % 5], max_bs=3)
        C, B, N = case.cp_size, len(case.extend_lens), sum(case.extend_lens)
        if N == 0:
            continue
        plan = plan_batch(
            case.prefix_lens,
            case.extend_lens,
            config(C, case.page_size),
            phases=rng.integers(0, C, B).tolist(),
        )
        x = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
        metas = [interleave_metadata(plan, r) for r in range(C)]
        shards = [x[m.local_index[: m.per_rank_logical_token[r]]] for r, m in enumerate(metas)]
        for r in range(C):
            group = FakeCPGroup(shards, r)
            parallel(monkeypatch, interleave, C, r, group)
            monkeypatch.setattr(interleave, "attn_cp_all_gather_into_tensor", group.all_gather_into_tensor)
            batch = types.SimpleNamespace(attn_cp_metadata=metas[r])
            assert torch.equal(ranked(C, r).gather_hidden_states(shards[r], batch), x), (case, r)


def test_metadata_refuses_a_zigzag_plan():
    plan = plan_batch([0], [10], CPConfig(2, 1, "rotation", "zigzag"))
    with pytest.raises(PlanError, match="cp_strategy='interleave'.*'zigzag'"):
        interleave_metadata(plan, 0)


def test_the_sglang_allocator_reads_cpkv_cp_strategy(monkeypatch):
    """cpkv's SGLang allocator builds its ``CPConfig`` from ``CPKV_CP_STRATEGY`` where SGLang constructs it
    (no code): an 8-page prompt at C=4, P=4 goes round robin, lanes 0, 1, 2, 3, 0, 1, 2, 3 (rotation, phase
    0), and every token's slot is on its page's lane; a bad value fails at construction, naming the variable."""
    sgl = pytest.importorskip("cpkv.integrations.sglang")
    from cpkv.errors import ConfigError

    args = dict(size=64, page_size=4, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    monkeypatch.setenv("CPKV_CP_STRATEGY", "interleave")
    alloc = sgl.OwnerLaneTokenToKVPoolAllocator(**args, cp_size=4, owner_policy="rotation")
    assert alloc.config.cp_strategy == "interleave"
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    out = alloc.alloc_extend(t([0]), t([0]), t([32]), t([32]), t([-1]), 32)
    assert alloc.last_plan.page_owners.tolist() == [0, 1, 2, 3] * 2
    assert ((out.numpy() // 4) % 4).tolist() == alloc.last_plan.token_owner.tolist()
    monkeypatch.setenv("CPKV_CP_STRATEGY", "ring")
    with pytest.raises(ConfigError, match="CPKV_CP_STRATEGY='ring'"):
        sgl.OwnerLaneTokenToKVPoolAllocator(**args, cp_size=4, owner_policy="rotation")
