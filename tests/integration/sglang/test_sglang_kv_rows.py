"""KV rows on each rank's own buffer through SGLang 0.5.23's own pool classes (MHA, MLA, DSA) on CPU.

A batch's ``out_cache_loc`` comes from cpkv's allocator as SGLang's scheduler gets it; every rank's pool is
SGLang's class with cpkv's write door (``cpkv.integrations.sglang_kv_rows``). Checked against the plain-Python
layout oracle (``tests/oracle.py``): rank r's buffer holds exactly the rows of the tokens whose pages it owns,
which are the tokens its plan has it compute (C-OWNER-EQ-COMPUTE), at ``write_slot`` (C-LAYOUT), never past
its ``size + page_size`` rows; the rank-major read at ``read_slot`` gives every row back.
"""

import pytest
import torch

import oracle

sgl = pytest.importorskip(
    "cpkv.integrations.sglang", reason="SGLang 0.5.23 does not import here (make test-sglang)"
)
rows_mod = pytest.importorskip("cpkv.integrations.sglang_kv_rows")

from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

from cpkv import ConfigError, LayoutError  # noqa: E402

pytestmark = pytest.mark.sglang

P, RANK_TOKENS = 4, 64  # SGLang's size=64, page_size=4: every rank's buffer has 64 + 4 = 68 rows


class Layer:
    """What SGLang's pools read of a ``RadixAttention``."""

    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


def batch(C: int, policy: str = "balanced", page_size: int = P, rank_tokens: int = RANK_TOKENS):
    """One extend batch through cpkv's allocator (SGLang's six arguments): two requests, 13 and 27 new
    tokens. Returns ``(out_cache_loc [40] int64, token_owner [40])``."""
    alloc = sgl.OwnerLaneTokenToKVPoolAllocator(
        rank_tokens, page_size, torch.float32, "cpu", None, False, cp_size=C, owner_policy=policy
    )
    prefix, seq = torch.tensor([0, 0]), torch.tensor([13, 27])
    loc = alloc.alloc_extend(prefix, prefix, seq, seq, torch.tensor([-1, -1]), 40)
    assert loc is not None
    return loc, alloc.last_plan.token_owner.tolist()


def mha_pools(C: int, cls=rows_mod.OwnerLaneMHATokenToKVPool):
    return [
        cls(
            size=RANK_TOKENS,
            page_size=P,
            dtype=torch.float32,
            head_num=2,
            head_dim=8,
            layer_num=2,
            device="cpu",
            enable_memory_saver=False,
            cp_size=C,
            cp_rank=r,
        )
        for r in range(C)
    ]


def mla_pools(C: int, cls=rows_mod.OwnerLaneMLATokenToKVPool):
    return [
        cls(
            size=RANK_TOKENS,
            page_size=P,
            dtype=torch.float32,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            layer_num=2,
            device="cpu",
            enable_memory_saver=False,
            cp_size=C,
            cp_rank=r,
        )
        for r in range(C)
    ]


def rows_of(n: int, width: int, heads: int = 2, base: float = 1.0) -> torch.Tensor:
    """``[n, heads, width]`` rows, all distinct and non-zero: token i, head h, column d -> base + i + h/10 + d/1000."""
    i = torch.arange(n, dtype=torch.float32)[:, None, None]
    h = torch.arange(heads, dtype=torch.float32)[None, :, None]
    d = torch.arange(width, dtype=torch.float32)[None, None, :]
    return base + i + h / 10 + d / 1000


def check_rank_buffers(buffers, loc, owners, expected, C):
    """Each rank's buffer holds exactly the rows of its own tokens at the oracle's write slot; nothing else."""
    slots = loc.tolist()
    for r, buf in enumerate(buffers):
        mine = [i for i, s in enumerate(slots) if oracle.owned(s, r, C, P)]
        assert mine == [i for i, o in enumerate(owners) if o == r]  # owner of the page == rank computing it
        want = torch.zeros_like(buf)
        for i in mine:
            want[oracle.write_slot(slots[i], C, P)] = expected[i]
        assert buf.shape[0] == RANK_TOKENS + P
        assert torch.equal(buf, want), f"rank {r}"


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@pytest.mark.clause("C-LAYOUT")
@pytest.mark.parametrize("policy", ["balanced", "rotation", "legacy"])
@pytest.mark.parametrize("C", [2, 3, 4, 8])
def test_mha_pool_rank_writes_its_own_tokens_at_write_slots_and_reads_back_rank_major(C, policy):
    loc, owners = batch(C, policy)
    pools = mha_pools(C)
    k, v = rows_of(40, 8), rows_of(40, 8, base=100.0)
    rows_mod.write_kv_rows(pools, Layer(1), loc, k, v)
    check_rank_buffers([p.k_buffer[1] for p in pools], loc, owners, k, C)
    check_rank_buffers([p.v_buffer[1] for p in pools], loc, owners, v, C)
    assert all(not p.k_buffer[0].any() for p in pools)  # layer 0 untouched
    got_k, got_v = rows_mod.read_kv_rows(pools, 1, loc)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    Q = (RANK_TOKENS + P) // P
    view = torch.cat([p.k_buffer[1] for p in pools])
    assert torch.equal(view[[oracle.read_slot(s, C, P, Q) for s in loc.tolist()]], k)


@pytest.mark.parametrize("C", [2, 3, 4, 8])
def test_a_rank_handed_only_its_own_tokens_writes_the_same_rows(C):
    """The write door takes the whole batch (SGLang's CP all-gathers K/V first) or a rank's own tokens."""
    loc, _ = batch(C)
    k = rows_of(40, 8)
    whole, own = mha_pools(C), mha_pools(C)
    rows_mod.write_kv_rows(whole, Layer(0), loc, k, k)
    for r, pool in enumerate(own):
        mine = torch.tensor(
            [i for i, s in enumerate(loc.tolist()) if oracle.owned(s, r, C, P)], dtype=torch.int64
        )
        pool.set_kv_buffer(Layer(0), loc[mine], k[mine], k[mine])
        assert torch.equal(pool.k_buffer[0], whole[r].k_buffer[0])


def test_sglangs_stock_pool_writes_past_its_buffer_where_cpkvs_stays_inside():
    """The issue's case: C = 8, size 64, page 4, a 40-token extend: out_cache_loc reaches past the 68 rows of
    one rank's buffer, so SGLang's own ``kv_buffer[out_cache_loc]`` fails; cpkv's pools keep every row < 68."""
    alloc = sgl.OwnerLaneTokenToKVPoolAllocator(64, 4, torch.float32, "cpu", None, False, cp_size=8)
    zero = torch.tensor([0])
    loc = alloc.alloc_extend(zero, zero, torch.tensor([40]), torch.tensor([40]), torch.tensor([-1]), 40)
    assert int(loc.max()) >= RANK_TOKENS + P
    stock = MHATokenToKVPool(
        size=64,
        page_size=4,
        dtype=torch.float32,
        head_num=2,
        head_dim=8,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    k = rows_of(40, 8)
    with pytest.raises((IndexError, RuntimeError)):
        stock.set_kv_buffer(Layer(0), loc, k, k)
    pools = [
        rows_mod.OwnerLaneMHATokenToKVPool(
            size=64,
            page_size=4,
            dtype=torch.float32,
            head_num=2,
            head_dim=8,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
            cp_size=8,
            cp_rank=r,
        )
        for r in range(8)
    ]
    rows_mod.write_kv_rows(pools, Layer(0), loc, k, k)
    assert (
        max(int(p.owned_rows(loc)[1].max()) for p in pools) < RANK_TOKENS + P
    )  # every rank owns some of 10 pages
    assert torch.equal(rows_mod.read_kv_rows(pools, 0, loc)[0], k)


@pytest.mark.clause("C-OWNER-EQ-COMPUTE")
@pytest.mark.parametrize("C", [2, 3, 4, 8])
def test_mla_pool_latent_rows_through_both_write_doors(C):
    loc, owners = batch(C, "rotation")
    latent = rows_of(40, 12, heads=1)
    with get_parallel().override(dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0):  # no decode CP
        by_kv, by_mla = mla_pools(C), mla_pools(C)
        rows_mod.write_kv_rows(by_kv, Layer(0), loc, latent)
        for pool in by_mla:
            pool.set_mla_kv_buffer(Layer(0), loc, latent[..., :8].contiguous(), latent[..., 8:].contiguous())
    for pools in (by_kv, by_mla):
        check_rank_buffers([p.kv_buffer[0] for p in pools], loc, owners, latent, C)
        k, v = rows_mod.read_kv_rows(pools, 0, loc)
        assert torch.equal(k, latent) and torch.equal(v, latent[..., :8])


@pytest.mark.parametrize("C", [2, 4])
def test_dsa_pool_builds_on_cpu_and_writes_latent_rows_on_its_lane(C):
    """SGLang's DSA (NSA) pool constructs on CPU at page_size 64; its latent rows take the MLA door."""
    page, size = 64, 256
    alloc = sgl.OwnerLaneTokenToKVPoolAllocator(size, page, torch.float32, "cpu", None, False, cp_size=C)
    zero = torch.tensor([0])
    loc = alloc.alloc_extend(zero, zero, torch.tensor([300]), torch.tensor([300]), torch.tensor([-1]), 300)
    owners = alloc.last_plan.token_owner.tolist()
    latent = rows_of(300, 12, heads=1)
    with get_parallel().override(dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0):  # no decode CP
        pools = [
            rows_mod.OwnerLaneDSATokenToKVPool(
                size=size,
                page_size=page,
                kv_lora_rank=8,
                dtype=torch.float32,
                qk_rope_head_dim=4,
                layer_num=1,
                device="cpu",
                index_head_dim=128,
                enable_memory_saver=False,
                kv_cache_dim=12,
                cp_size=C,
                cp_rank=r,
            )
            for r in range(C)
        ]
        rows_mod.write_kv_rows(pools, Layer(0), loc, latent)
    assert isinstance(pools[0], DSATokenToKVPool)
    for r, pool in enumerate(pools):
        buf = pool.kv_buffer[0]
        mine = [i for i, o in enumerate(owners) if o == r]
        assert [oracle.lane_of(s, C, page) for s in loc[mine].tolist()] == [r] * len(mine)
        for i in mine:
            assert torch.equal(buf[oracle.write_slot(int(loc[i]), C, page)], latent[i])
        assert int((buf.abs().sum((1, 2)) > 0).sum()) == len(mine)
    assert torch.equal(rows_mod.read_kv_rows(pools, 0, loc)[0], latent)


def test_sglangs_platform_hook_serves_these_pools_for_each_kind(monkeypatch):
    """``get_kv_pool_cls(kind=...)`` of cpkv's platform: SGLang's pool class of that kind (the configurator
    checks the subclass), bound to CPKV_CP_SIZE."""
    plugin = pytest.importorskip("cpkv.integrations.sglang_platform")
    monkeypatch.setenv("CPKV_CP_SIZE", "4")
    platform = plugin.OwnerLaneCpuPlatform()
    for kind, base in (("mha", MHATokenToKVPool), ("mla", MLATokenToKVPool), ("dsa", DSATokenToKVPool)):
        cls = platform.get_kv_pool_cls(kind=kind)
        assert issubclass(cls, base) and issubclass(cls, rows_mod.OwnerLaneKVPoolMixin)
        assert cls.default_cp_size == 4 and platform.get_kv_pool_cls(kind=kind) is cls


def test_bad_writes_and_groups_are_typed_errors():
    loc, _ = batch(2)
    pools = mha_pools(2)
    with pytest.raises(LayoutError, match="39 K/V rows for 40 slots"):
        pools[0].set_kv_buffer(Layer(0), loc, rows_of(39, 8), rows_of(39, 8))
    with pytest.raises(ConfigError, match="pools must be ranks 0 .. C-1 of one group, got ranks \\[1, 0\\]"):
        rows_mod.write_kv_rows(pools[::-1], Layer(0), loc, rows_of(40, 8), rows_of(40, 8))
    with pytest.raises(ConfigError, match="cp_rank=2 out of range"):
        mha_pools(2, cls=lambda **kw: rows_mod.OwnerLaneMHATokenToKVPool(**(kw | {"cp_rank": 2})))
    with pytest.raises(ConfigError, match="dcp_kv_mask"):
        pools[0].set_kv_buffer(Layer(0), loc, rows_of(40, 8), rows_of(40, 8), dcp_kv_mask=torch.ones(40))
    with pytest.raises(LayoutError, match="slot -1 is padding"):
        rows_mod.read_kv_rows(pools, 0, torch.tensor([-1]))


def test_sglangs_slot_moving_writers_are_refused_at_cp_size_above_1():
    """Retraction offload (get_cpu_copy / load_cpu_copy) and speculative moves (move_kv_cache,
    set_kv_buffer_prefix_valid) address rows by group slot across ranks: a one-line ConfigError at C > 1.
    At C = 1 the pool is SGLang's own: the offload round trip gives the rows back."""
    loc = torch.tensor([4, 5, 6, 7])
    pool = mha_pools(2)[0]
    calls = {
        "get_cpu_copy": lambda: pool.get_cpu_copy(loc),
        "load_cpu_copy": lambda: pool.load_cpu_copy(None, loc),
        "move_kv_cache": lambda: pool.move_kv_cache(loc, loc),
        "set_kv_buffer_prefix_valid": lambda: pool.set_kv_buffer_prefix_valid(
            Layer(0), loc.reshape(1, 4), torch.tensor([4]), *[rows_of(4, 8)] * 2
        ),
    }
    for name, call in calls.items():
        with pytest.raises(ConfigError, match=f"^{name} .* cpkv's owner lanes do not serve at cp_size=2"):
            call()
    (one,) = mha_pools(1)
    k = rows_of(4, 8)
    one.set_kv_buffer(Layer(1), loc, k, k + 1)
    saved = one.get_cpu_copy(loc)
    one.k_buffer[1].zero_()
    one.v_buffer[1].zero_()
    one.load_cpu_copy(saved, loc)
    assert torch.equal(one.k_buffer[1][4:8], k) and torch.equal(one.v_buffer[1][4:8], k + 1)


def test_the_write_plan_is_computed_once_a_batch_and_again_when_out_cache_loc_changes():
    """Every layer writes through the same out_cache_loc: one translation a batch; a new batch (or the same
    tensor written in place) is translated again."""
    loc, owners = batch(4)
    (pool,) = mha_pools(4)[1:2]
    first = pool.owned_rows(loc)
    assert pool.owned_rows(loc) is first
    assert first[0].tolist() == [i for i, o in enumerate(owners) if o == 1]
    moved = loc.clone()
    assert pool.owned_rows(moved) is not first and torch.equal(pool.owned_rows(moved)[1], first[1])
    moved.copy_(torch.flip(loc, [0]))  # same storage, new contents
    index, rows = pool.owned_rows(moved)
    assert index.tolist() == [39 - i for i in reversed(first[0].tolist())] and torch.equal(
        rows, first[1].flip(0)
    )
