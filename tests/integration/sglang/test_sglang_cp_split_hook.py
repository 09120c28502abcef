"""cpkv's CP split hook on SGLang 0.5.23's ``prepare_cp_forward`` (``cpkv.integrations.sglang_cp_split``).

SGLang's own ``sglang.srt.layers.cp.utils.prepare_cp_forward`` (hooked by ``sglang_hooks.register``) is
called the way its eager runner calls it, inside SGLang's own forward context. Stand-ins: the forward batch
(the fields ``prepare_cp_forward`` reads: forward mode, input ids, seq / extend lengths, ``out_cache_loc``,
rids), the KV pool (an object the allocator links itself to; the forward context's attention backend holds
it), the rank (``get_parallel().override``) and the active strategy (SGLang's own ``ZigzagCPStrategy``).
The allocator is cpkv's ``OwnerLaneTokenToKVPoolAllocator`` under ``balanced``, allocating through SGLang's
own call signature, so ``out_cache_loc`` and ``last_plan`` are what a server's would be.

The tokens a rank computes are what SGLang's own ``shard_position_ids`` gives it on the metadata (its
logical rows), and the rank a token's page lives on is the lane of its ``out_cache_loc`` slot.
"""

import dataclasses
import types

import numpy as np
import pytest
import torch
from sglang_topology import cp_topology

from sglang_cp_cases import assert_same

sgl = pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
hooks = pytest.importorskip("cpkv.integrations.sglang_hooks")
split = pytest.importorskip("cpkv.integrations.sglang_cp_split")
cp_utils = pytest.importorskip("sglang.srt.layers.cp.utils")

from sglang.srt.layers.cp import base as cp_base  # noqa: E402
from sglang.srt.layers.cp.interleave import InterleaveCPStrategy  # noqa: E402
from sglang.srt.layers.cp.padding import pad_logical_token_to_physical  # noqa: E402
from sglang.srt.layers.cp.zigzag import ZigzagContextParallelMetadata, ZigzagCPStrategy  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

from cpkv import ConfigError, UnsupportedPagePlan  # noqa: E402
from cpkv.integrations import sglang_cp  # noqa: E402

pytestmark = pytest.mark.sglang

CP_SIZES = [2, 3, 4, 8]


@pytest.fixture
def cpkv_cp(monkeypatch):
    """``SGLANG_PLATFORM=cpkv``, the hooks applied; ``setup(C)`` makes SGLang's zigzag strategy the active one."""
    monkeypatch.setenv("SGLANG_PLATFORM", "cpkv")
    hooks.register()
    assert hooks.hook_applied(split.TARGET, split.prepare_cp_metadata)
    from sglang.srt.model_executor.runner import eager_runner  # calls it by its own imported name

    assert eager_runner.prepare_cp_forward is cp_utils.prepare_cp_forward

    def setup(C, strategy=ZigzagCPStrategy):
        monkeypatch.setenv("CPKV_CP_SIZE", str(C))
        monkeypatch.setattr(cp_base, "_STRATEGY", strategy(cp_size=C))

    return setup


def allocator(C, P, pages_per_rank=64):
    """cpkv's allocator (SGLang's six arguments) linked to a stand-in KV pool."""
    pool = types.SimpleNamespace()
    alloc = sgl.OwnerLaneTokenToKVPoolAllocator(
        pages_per_rank * P, P, torch.float32, "cpu", pool, False, cp_size=C, owner_policy="balanced"
    )
    assert pool.owner_lane_allocator is alloc
    return alloc, pool


def extend(alloc, prefix, ext, last_loc):
    """SGLang's ``alloc_extend`` call for one batch; returns ``out_cache_loc``."""
    L0, seq = torch.tensor(prefix), torch.tensor([p + e for p, e in zip(prefix, ext, strict=True)])
    loc = alloc.alloc_extend(L0, L0, seq, seq, torch.tensor(last_loc), sum(ext))
    assert loc is not None
    return loc


def balanced_batch(C, P):
    """A warm-up chain of 2C+1 pages (the lanes now uneven), then a batch of two requests: one continuing
    the chain (page-aligned prefix), one fresh. Returns ``(alloc, pool, forward-batch fields)``."""
    alloc, pool = allocator(C, P)
    warm = extend(alloc, [0], [(2 * C + 1) * P], [-1])
    prefix, ext = [(2 * C + 1) * P, 0], [2 * C * P + 3, 4 * C * P - 1]
    loc = extend(alloc, prefix, ext, [int(warm[-1]), -1])
    return alloc, pool, dict(prefix=prefix, ext=ext, loc=loc)


def forward_batch(prefix, ext, loc, rids=None):
    """The fields SGLang's ``prepare_cp_forward`` reads, as its ``ForwardBatch`` holds them for a prefill."""
    N = sum(ext)
    return types.SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        input_ids=torch.zeros(N, dtype=torch.int64),
        seq_lens_cpu=torch.tensor([p + e for p, e in zip(prefix, ext, strict=True)]),
        extend_seq_lens_cpu=list(ext),
        out_cache_loc=loc,
        attn_cp_metadata=None,
        global_num_tokens_cpu=None,
        rids=rids or [f"req-{i}" for i in range(len(ext))],
    )


def prepare(C, rank, pool, batch):
    """SGLang's ``prepare_cp_forward`` (hooked) on ``batch`` as rank ``rank`` inside its forward context."""
    backend = types.SimpleNamespace(token_to_kv_pool=pool)
    topology = cp_topology(C, rank) | dict(enable_cp_tp_group_sharing=False)
    with get_parallel().override(**topology), forward_context(ForwardContext(attn_backend=backend)):
        cp_utils.prepare_cp_forward(batch)
    return batch.attn_cp_metadata


def computed_tokens(C, rank, batch):
    """Flat extend indices rank ``rank`` computes: SGLang's own shard of positions on the metadata."""
    meta = batch.attn_cp_metadata
    with get_parallel().override(**cp_topology(C, rank)):
        local = ZigzagCPStrategy(cp_size=C).shard_position_ids(
            torch.arange(sum(batch.extend_seq_lens_cpu)), batch
        )
    return local[: meta.per_rank_logical_token[rank]].numpy()


def slot_lanes(loc, C, P):
    return (loc.numpy() // P) % C


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@pytest.mark.clause("C-ZIGZAG")
@pytest.mark.parametrize("P", [1, 4])
@pytest.mark.parametrize("C", CP_SIZES)
def test_hooked_split_is_cpkvs_and_every_rank_computes_its_own_pages(C, P, cpkv_cp):
    """Through the hooked ``prepare_cp_forward``: every rank's metadata is cpkv's (every SGLang field, after
    SGLang's padding step), and each token a rank computes sits on a page of its lane; all ranks together
    compute every token once."""
    cpkv_cp(C)
    alloc, pool, b = balanced_batch(C, P)
    plan, lanes = alloc.last_plan, slot_lanes(b["loc"], C, P)
    assert np.array_equal(lanes, plan.token_owner)
    seen = []
    for r in range(C):
        batch = forward_batch(b["prefix"], b["ext"], b["loc"])
        meta = prepare(C, r, pool, batch)
        assert (
            type(meta) is ZigzagContextParallelMetadata
            and meta.request_phases == plan.request_phases.tolist()
        )
        ours = sglang_cp.zigzag_metadata(plan, r)
        with get_parallel().override(**cp_topology(C, r)):
            pad_logical_token_to_physical(ours)
        for f in dataclasses.fields(ZigzagContextParallelMetadata):
            assert_same(getattr(meta, f.name), getattr(ours, f.name), f"C={C} P={P} rank {r}: {f.name}")
        tokens = computed_tokens(C, r, batch)
        assert tokens.size == plan.per_rank_tokens[r]
        assert (lanes[tokens] == r).all(), f"rank {r} computes tokens on lanes {sorted(set(lanes[tokens]))}"
        seen.append(tokens)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(sum(b["ext"])))


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@pytest.mark.parametrize("P", [1, 4])
@pytest.mark.parametrize("C", CP_SIZES)
def test_without_the_hook_sglangs_split_disagrees_with_cpkvs_owners(C, P, cpkv_cp, monkeypatch):
    """SGLANG_PLATFORM unset (the hook passes through): SGLang's own split of the same balanced batch puts
    some tokens on ranks other than their page's lane."""
    cpkv_cp(C)
    alloc, pool, b = balanced_batch(C, P)
    assert (
        alloc.last_plan.request_phases.any() or P > 1
    )  # a balanced plan SGLang's phase-0 split cannot match
    monkeypatch.delenv("SGLANG_PLATFORM")
    lanes, wrong = slot_lanes(b["loc"], C, P), 0
    for r in range(C):
        batch = forward_batch(b["prefix"], b["ext"], b["loc"])
        meta = prepare(C, r, pool, batch)
        assert not hasattr(meta, "request_phases")  # SGLang's own build
        wrong += int((lanes[computed_tokens(C, r, batch)] != r).sum())
    assert wrong > 0


@pytest.mark.clause("C-HEAD")
@pytest.mark.parametrize("C", CP_SIZES)
def test_head_tokens_stop_the_forward_with_one_line_naming_the_request(C, cpkv_cp):
    """A prefix ending inside a page (5 tokens, page_size 4): ``UnsupportedPagePlan`` naming the rid, the
    prefix_len and the page size; SGLang's metadata is left unset."""
    cpkv_cp(C)
    P = 4
    alloc, pool = allocator(C, P)
    warm = extend(alloc, [0], [5], [-1])
    loc = extend(alloc, [5], [4 * C * P], [int(warm[-1])])
    batch = forward_batch([5], [4 * C * P], loc, rids=["chat-17"])
    with pytest.raises(UnsupportedPagePlan) as e:
        prepare(C, 0, pool, batch)
    msg = str(e.value)
    assert "\n" not in msg and "'chat-17'" in msg and "prefix_len=5" in msg and "page_size=4" in msg
    assert batch.attn_cp_metadata is None


@pytest.mark.parametrize("C", CP_SIZES)
def test_a_plan_that_is_not_the_batchs_stops_with_one_line(C, cpkv_cp):
    """The allocator's last plan of another batch (other lengths), or an ``out_cache_loc`` whose slots are not
    on the plan's lanes: ConfigError, one line; nothing is computed on a guessed split."""
    cpkv_cp(C)
    P = 4
    alloc, pool, b = balanced_batch(C, P)
    shorter = forward_batch(b["prefix"], [b["ext"][0], b["ext"][1] - P], b["loc"][: sum(b["ext"]) - P])
    with pytest.raises(ConfigError, match="is not this forward's batch") as e:
        prepare(C, 0, pool, shorter)
    assert "\n" not in str(e.value)
    moved = forward_batch(b["prefix"], b["ext"], b["loc"] + P)  # every slot one page on: the next lane
    with pytest.raises(ConfigError, match="out_cache_loc does not match"):
        prepare(C, 0, pool, moved)
    short = forward_batch(b["prefix"], b["ext"], b["loc"][:-1])
    with pytest.raises(
        ConfigError, match=f"out_cache_loc holds {sum(b['ext']) - 1} slots for {sum(b['ext'])}"
    ):
        prepare(C, 0, pool, short)


@pytest.mark.parametrize("C", CP_SIZES)
def test_interleave_strategy_or_an_unlinked_pool_stops_with_one_line(C, cpkv_cp):
    """SGLang's interleave CP strategy (cpkv's plans are zigzag), or a forward whose KV pool has no cpkv
    allocator (a draft model's own pool): ConfigError, not SGLang's split."""
    alloc, pool, b = balanced_batch(C, 4)
    cpkv_cp(C)
    with pytest.raises(ConfigError, match="no cpkv allocator"):
        prepare(C, 0, types.SimpleNamespace(), forward_batch(b["prefix"], b["ext"], b["loc"]))
    cpkv_cp(C, InterleaveCPStrategy)
    with pytest.raises(ConfigError, match="cp_strategy is 'interleave'"):
        prepare(C, 0, pool, forward_batch(b["prefix"], b["ext"], b["loc"]))


@pytest.mark.clause("C-HEAD")
@pytest.mark.parametrize("C", CP_SIZES)
def test_sglangs_chunk_cuts_land_on_page_ends_so_the_next_chunk_has_no_head_tokens(C, cpkv_cp, monkeypatch):
    """SGLang's ``PrefillAdder.floor_chunked_tokens`` (hooked) on cpkv's allocator: a cut of 4P+3 tokens
    becomes 4P, and the request's next chunk then plans and splits (prefix on a page end); SGLang's own
    cut (SGLANG_PLATFORM unset) would give that chunk head tokens, which stop the forward. A cut under one
    page and a last chunk (not a cut) are left as SGLang makes them."""
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.mem_cache.radix_cache import RadixCache

    assert hooks.hook_applied(split.CHUNK_TARGET, split.page_aligned_chunk)
    cpkv_cp(C)
    P, remaining = 4, 4 * C * 4 + 40
    alloc, pool = allocator(C, P)
    tree = RadixCache.create_simulated(mock_allocator=alloc, page_size=P)
    adder = PrefillAdder(
        P,
        tree,
        alloc,
        running_batch=types.SimpleNamespace(reqs=[]),
        new_token_ratio=0.5,
        rem_input_tokens=64,
        rem_chunk_tokens=None,
    )
    cut = adder.floor_chunked_tokens(4 * P + 3, remaining)
    assert cut == 4 * P
    assert adder.floor_chunked_tokens(P - 1, remaining) == P - 1 and adder.floor_chunked_tokens(50, 50) == 50
    first = extend(alloc, [0], [cut], [-1])
    rest = remaining - cut
    loc = extend(alloc, [cut], [rest], [int(first[-1])])
    meta = prepare(C, 0, pool, forward_batch([cut], [rest], loc))
    assert meta.kv_len_next_list[0] <= remaining and not alloc.last_plan.head_tokens.any()
    monkeypatch.delenv("SGLANG_PLATFORM")
    assert adder.floor_chunked_tokens(4 * P + 3, remaining) == 4 * P + 3  # SGLang's own cut: inside a page
