"""PD transfer from every CP rank: SGLang 0.5.23's own send filter on cpkv's pages.

cpkv's plugin (``sglang_hooks``) sets ``kv_shard_size = C`` and ``kv_shard_rank`` = the attention-CP rank on a
PD prefill worker's ``CommonKVManager`` before SGLang's ``__init__`` runs (no ``--enable-kv-cache-sharding``),
so each CP rank's ``CommonKVSender._prepare_send_indices`` passes the request's pages through SGLang's
``filter_kv_indices_for_shard_rank``: the rank sends the pages on its lane, as its local page ids, at their
positions in the decode's destination list; on the decode worker the hook makes SGLang pull from every
prefill CP rank. Checked here at C in {2, 3, 4, 8}: the ranks' sends cover every
page of the request exactly once, each from the rank that computed it (C-OWNER-EQ-COMPUTE), and the decode,
copying each rank's local pages from that rank's own KV buffer (``sglang_kv_rows``), holds the request's rows.
"""

import types

import pytest
import torch
from sglang_topology import cp_topology

sgl = pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
hooks = pytest.importorskip("cpkv.integrations.sglang_hooks")
rows_mod = pytest.importorskip("cpkv.integrations.sglang_kv_rows")

from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVSender, PrefillServerInfo  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.mem_cache.common import kv_to_page_indices  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

from cpkv import ConfigError  # noqa: E402

pytestmark = pytest.mark.sglang

P, RANK_TOKENS = 4, 64
PREFIX, TOTAL = 12, 45  # a cached 3-page prefix, then a 33-token extend: 12 pages, the last one partial


class Layer:
    layer_id = 0


class _Stop(Exception):
    """Raised by ``_StopArgs`` on SGLang's first read of its KVArgs: ``__init__`` stops after the hooks' BEFORE."""


class _StopArgs:
    def __getattr__(self, name):
        raise _Stop(name)


@pytest.fixture
def cpkv_prefill(monkeypatch):
    monkeypatch.setenv("SGLANG_PLATFORM", "cpkv")
    hooks.register()

    def select(C):
        monkeypatch.setenv("CPKV_CP_SIZE", str(C))

    return select


def manager(C: int, rank: int, mode=DisaggregationMode.PREFILL) -> CommonKVManager:
    """SGLang's ``CommonKVManager.__init__`` (hooked) on CP rank ``rank`` of ``C``, stopped at its first read
    of the KV args (a real one binds sockets and registers with the bootstrap server): what the BEFORE hook
    left on the instance is what SGLang's ``__init__`` body then reads."""
    mgr = object.__new__(CommonKVManager)
    with get_parallel().override(**cp_topology(C, rank)), pytest.raises(_Stop, match="kv_cache_dtype_str"):
        CommonKVManager.__init__(mgr, _StopArgs(), mode, None)
    return mgr


def request(C: int):
    """A request's ``req_to_token`` row on cpkv's allocator: a 3-page prefix computed first, then the extend
    (its ``last_loc`` the prefix's last slot). Returns ``(row [45] int64, page owners of the row's pages)``."""
    alloc = sgl.OwnerLaneTokenToKVPoolAllocator(RANK_TOKENS, P, torch.float32, "cpu", None, False, cp_size=C)
    zero, p = torch.tensor([0]), torch.tensor([PREFIX])
    prefix = alloc.alloc_extend(zero, zero, p, p, torch.tensor([-1]), PREFIX)
    owners = alloc.last_plan.page_owners.tolist()
    t = torch.tensor([TOTAL])
    extend = alloc.alloc_extend(p, p, t, t, prefix[-1:], TOTAL - PREFIX)
    owners += alloc.last_plan.page_owners.tolist()
    return torch.cat([prefix, extend]), owners


def sends(sender: CommonKVSender, pages, chunks):
    """``_prepare_send_indices`` over the request's pages in ``chunks`` (as ``send_kv_chunk`` segments):
    ``[(local pages, decode positions)]`` of the chunks the rank does not skip."""
    sent, start = [], 0
    for n in chunks:
        local, positions, _, skip = sender._prepare_send_indices(pages[start : start + n])
        start += n
        if not skip:  # positions: an array (filtered) or SGLang's contiguous slice (unfiltered)
            if isinstance(positions, slice):
                positions = range(positions.start, positions.stop)
            sent.append((local.tolist(), [int(i) for i in positions]))
    return sent


def sender_of(mgr, n_pages) -> CommonKVSender:
    sender = object.__new__(CommonKVSender)
    sender.kv_mgr, sender.curr_idx, sender.num_kv_indices = mgr, 0, n_pages
    return sender


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@pytest.mark.clause("C-LAYOUT")
@pytest.mark.parametrize("C", [2, 3, 4, 8])
def test_every_cp_rank_sends_its_own_pages_and_together_they_cover_the_request_once(C, cpkv_prefill):
    cpkv_prefill(C)
    row, owners = request(C)
    pages = kv_to_page_indices(row, P)  # SGLang's page ids of the row: 12 pages
    assert len(pages) == len(owners) == -(-TOTAL // P)
    # each rank's K/V rows, written through SGLang's pools with cpkv's write door when they were computed
    pools = [
        rows_mod.OwnerLaneMHATokenToKVPool(
            size=RANK_TOKENS,
            page_size=P,
            dtype=torch.float32,
            head_num=1,
            head_dim=4,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
            cp_size=C,
            cp_rank=r,
        )
        for r in range(C)
    ]
    k = torch.arange(TOTAL, dtype=torch.float32)[:, None, None].expand(TOTAL, 1, 4) + 1
    rows_mod.write_kv_rows(pools, Layer(), row, k, k)
    dst = [100 + 3 * i for i in range(len(pages))]  # the decode's own page ids for this request
    decode_k = torch.zeros(max(dst) * P + P, 1, 4)  # the decode's pool (unsharded)
    covered = []
    for r in range(C):
        mgr = manager(C, r)
        assert (mgr.kv_shard_size, mgr.kv_shard_rank) == (C, r)
        for local, positions in sends(sender_of(mgr, len(pages)), pages, chunks=(5, len(pages) - 5)):
            for lp, pos in zip(local, positions, strict=True):
                assert (
                    owners[pos] == r == pages[pos] % C and lp == pages[pos] // C
                )  # the page's owner sends it
                assert lp * P == int(pools[r].layout.write_slots(torch.tensor([pages[pos] * P]))[0])
                decode_k[dst[pos] * P : dst[pos] * P + P] = pools[r].k_buffer[0][lp * P : lp * P + P]
                covered.append(pos)
    assert sorted(covered) == list(range(len(pages)))  # every page exactly once
    got = torch.cat([decode_k[d * P : d * P + P] for d in dst])[:TOTAL]
    assert torch.equal(got, k)  # the decode holds the request's rows, prefix included


@pytest.mark.parametrize("C", [2, 8])
def test_without_cpkv_the_ranks_send_global_page_ids_past_a_ranks_buffer(C, cpkv_prefill, monkeypatch):
    """SGLANG_PLATFORM unset: the hook leaves SGLang's unsharded manager (shard size 1), whose rank 0 sends
    the group's page ids as they are: at C = 8 some lie past one rank's 17 pages."""
    cpkv_prefill(C)
    monkeypatch.delenv("SGLANG_PLATFORM")
    row, _ = request(C)
    pages = kv_to_page_indices(row, P)
    mgr = manager(C, 0)
    assert "kv_shard_size" not in vars(mgr) and mgr.kv_shard_size == 1
    mgr.enable_all_cp_ranks_for_transfer, mgr.is_dummy_cp_rank = False, False  # SGLang's rank 0, CP unsharded
    ((sent, positions),) = sends(sender_of(mgr, len(pages)), pages, chunks=(len(pages),))
    assert sent == pages.tolist() and positions == list(range(len(pages)))
    assert (max(sent) >= RANK_TOKENS // P + 1) == (C == 8)


def decode_manager(enable_all_cp_ranks: bool) -> CommonKVManager:
    """A decode worker's manager (attention TP 1, CP 1, PP 1) as SGLang's ``__init__`` leaves the fields its
    ``_resolve_rank_mapping`` reads."""
    mgr = object.__new__(CommonKVManager)
    mgr.is_mla_backend = mgr.is_hybrid_mla_backend = False
    mgr.kv_args = types.SimpleNamespace(engine_rank=0)
    mgr.attn_tp_size, mgr.attn_cp_size, mgr.attn_cp_rank, mgr.pp_size, mgr.pp_rank = 1, 1, 0, 1, 0
    mgr.enable_all_cp_ranks_for_transfer = enable_all_cp_ranks
    return mgr


@pytest.mark.parametrize("C", [2, 3, 4, 8])
def test_the_decode_side_stays_unsharded_and_pulls_from_every_prefill_cp_rank(C, cpkv_prefill, monkeypatch):
    """The decode (CP 1, ``CPKV_CP_SIZE=1``) keeps SGLang's unsharded manager; cpkv's AFTER hook makes its
    ``_resolve_rank_mapping`` target all C prefill CP ranks and wait for C responses, one per sender."""
    cpkv_prefill(1)
    mgr = manager(1, 0, DisaggregationMode.DECODE)
    assert "kv_shard_size" not in vars(mgr) and mgr.kv_shard_size == 1
    prefill = dict(
        attn_tp_size=1,
        attn_cp_size=C,
        dp_size=1,
        pp_size=1,
        page_size=P,
        kv_cache_dtype="auto",
        follow_bootstrap_room=True,
    )
    mgr = decode_manager(False)  # what SGLang's __init__ computes for a CP-1 decode
    hooks.pd_every_cp_rank_sends(None, mgr, None, DisaggregationMode.DECODE)
    info = PrefillServerInfo(**prefill)
    mgr._resolve_rank_mapping(info)
    assert (info.target_cp_ranks, info.required_prefill_response_num) == (list(range(C)), C)
    monkeypatch.delenv("SGLANG_PLATFORM")  # without cpkv: CP rank 0 only
    mgr = decode_manager(False)
    hooks.pd_every_cp_rank_sends(None, mgr, None, DisaggregationMode.DECODE)
    info = PrefillServerInfo(**prefill)
    mgr._resolve_rank_mapping(info)
    assert (info.target_cp_ranks, info.required_prefill_response_num) == ([0], 1)


def test_a_cp_rank_that_is_not_a_sender_or_a_cp_size_mismatch_is_one_line(cpkv_prefill):
    cpkv_prefill(4)
    mgr = manager(4, 3)
    mgr.enable_all_cp_ranks_for_transfer = False  # what SGLang's CP-TP group sharing leaves
    with pytest.raises(
        ConfigError, match=r"^PD prefill CP rank 3 of 4 is not a KV sender \(--enable-cp-tp-group-sharing\?\)"
    ):
        hooks.pd_every_cp_rank_sends(None, mgr, None, DisaggregationMode.PREFILL)
    mgr.enable_all_cp_ranks_for_transfer, mgr.is_dummy_cp_rank = True, False
    assert hooks.pd_every_cp_rank_sends(None, mgr, None, DisaggregationMode.PREFILL) is None
    with pytest.raises(ConfigError, match="^CPKV_CP_SIZE=4 but SGLang's attention CP size is attn_cp_size=2"):
        manager(2, 1)
