"""Random batches and checks shared by the kernel tests (SPEC C-KERNEL).

``tests/unit/kernels/`` runs the checks on the CPU through Triton's interpreter, ``tests/kernels/`` on a
CUDA device (compiled kernels). Each check compares a kernel with the numpy reference
(``cpkv.slots.extend_slots``, ``SharedKVLayout`` on numpy arrays, numpy fancy indexing by ``plan.gather_index``) and,
for ``out_cache_loc``, with the independent per-token oracle; equality is bit for bit (floats compared
through their integer bit patterns, NaN payloads included).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

import oracle
from cpkv import CPConfig, SharedKVLayout, plan_batch
from cpkv import kernels as K
from cpkv.planner import BatchPlan
from cpkv.slots import extend_slots

POLICIES = ("rotation", "legacy", "balanced")
STRATEGIES = ("zigzag", "interleave")
ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.uint8, torch.int32)
SLOT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_BITS = {
    1: (torch.uint8, np.uint8),
    2: (torch.int16, np.int16),
    4: (torch.int32, np.int32),
    8: (torch.int64, np.int64),
}


@dataclass(frozen=True)
class Batch:
    """A planned batch with allocated-looking inputs: ``last_locs`` int64 ``[B]`` (consistent with the
    prefixes: ``(last_loc + 1) % P == prefix_len % P``), ``new_pages`` int64 ``[sum m]`` distinct ids."""

    plan: BatchPlan
    last_locs: np.ndarray
    new_pages: np.ndarray


CP_SIZES = st.integers(1, 16)
PAGE_SIZES = st.one_of(st.sampled_from([1, 2, 3, 16, 64]), st.integers(1, 256))


@st.composite
def batches(draw, cp_sizes=CP_SIZES, page_sizes=PAGE_SIZES, max_requests: int = 4, max_tokens: int = 1500):
    """A batch of 0..max_requests requests: unaligned prefixes, empty extends, extends shorter than 2C
    pages, explicit phases or any owner policy, either CP strategy (C-INTERLEAVE: one run per page), head
    owners on any lane; ``sum E <= max_tokens``."""
    C = draw(cp_sizes)
    P = draw(page_sizes)
    B = draw(st.integers(0, max_requests))
    L0, E = [], []
    for _ in range(B):
        k = draw(st.integers(0, 6))
        L0.append(draw(st.sampled_from([0, k * P, k * P + draw(st.integers(0, P - 1))])))
        budget = max(0, max_tokens // max(B, 1))
        E.append(
            draw(st.sampled_from([0, min(budget, draw(st.integers(1, 2 * C))), draw(st.integers(0, budget))]))
        )
    heads = [draw(st.integers(0, C - 1)) for _ in range(B)]
    phases = draw(st.one_of(st.none(), st.lists(st.integers(0, C - 1), min_size=B, max_size=B)))
    policy = draw(st.sampled_from(POLICIES))
    strategy = draw(st.sampled_from(STRATEGIES))
    plan = plan_batch(L0, E, CPConfig(C, P, policy, strategy), head_owners=heads, phases=phases)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    num_pages = plan.page_owners.shape[0]
    pages = (
        rng.permutation(num_pages + B + 8)[:num_pages] + 1
    )  # distinct ids, any lane: the kernel trusts them
    last = np.where(plan.prefix_lens > 0, rng.integers(1, 64, size=B) * P + (plan.prefix_lens - 1) % P, -1)
    return Batch(plan=plan, last_locs=last.astype(np.int64), new_pages=pages.astype(np.int64))


@st.composite
def layouts_and_slots(draw, cp_sizes=CP_SIZES, page_sizes=PAGE_SIZES, max_slots: int = 3000):
    """A ``SharedKVLayout`` and int64 numpy slots in ``[-3, C*Q*P)`` (some -1), 1-D or 2-D."""
    C = draw(cp_sizes)
    P = draw(page_sizes)
    Q = draw(st.integers(1, 64))
    layout = SharedKVLayout(C, P, Q)
    n = draw(st.integers(0, max_slots))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    slots = rng.integers(-3, layout.num_slots, size=n, dtype=np.int64)
    slots[rng.random(n) < 0.1] = -1
    if n and draw(st.booleans()):
        slots[rng.integers(0, n)] = layout.num_slots - 1  # the pool's last slot
    shape = draw(st.sampled_from([(n,), (1, n)] + ([(2, n // 2)] if n % 2 == 0 else [])))
    return layout, slots.reshape(shape)


def random_rows(rows: int, width: int, dtype: torch.dtype, seed: int, device) -> torch.Tensor:
    """``[rows, width]`` of random bit patterns viewed as ``dtype`` (NaNs, infinities, subnormals included)."""
    bits_t, _ = _BITS[torch.empty(0, dtype=dtype).element_size()]
    g = torch.Generator().manual_seed(seed)
    info = torch.iinfo(bits_t)
    raw = torch.randint(info.min, info.max, (rows, width), generator=g, dtype=torch.int64).to(bits_t)
    return raw.view(dtype).to(device)


def bits(x: torch.Tensor) -> np.ndarray:
    """``x``'s elements as their integer bit patterns, a numpy array on the host."""
    bits_t, bits_np = _BITS[x.element_size()]
    return x.detach().cpu().contiguous().view(bits_t).numpy().view(bits_np)


# ----------------------------------------------------------------------------------------------------
# checks: kernel == numpy reference, bit for bit
# ----------------------------------------------------------------------------------------------------


def check_fill_out_cache_loc(batch: Batch, device, use_out: bool = False) -> torch.Tensor:
    """``fill_out_cache_loc`` equals the allocator's numpy reference and the per-token oracle."""
    plan, last, pages = batch.plan, batch.last_locs, batch.new_pages
    out = torch.full((plan.num_tokens,), -7, dtype=torch.int64, device=device) if use_out else None
    got = K.fill_out_cache_loc(plan, last, pages, device=device, out=out)
    assert got.dtype == torch.int64 and got.device.type == torch.device(device).type
    assert out is None or got.data_ptr() == out.data_ptr()
    ref = extend_slots(plan, last, pages)
    assert np.array_equal(got.cpu().numpy(), ref)
    expected = []  # the oracle, request by request
    for i in range(plan.num_requests):
        p0, p1 = plan.page_indptr[i], plan.page_indptr[i + 1]
        expected += oracle.out_cache_loc(
            int(plan.prefix_lens[i]),
            int(plan.extend_lens[i]),
            int(last[i]),
            pages[p0:p1].tolist(),
            plan.config.page_size,
        )
    assert got.cpu().tolist() == expected
    return got


def check_translations(
    layout: SharedKVLayout, slots: np.ndarray, dtype: torch.dtype, device, use_out: bool
) -> None:
    """``read_slots`` / ``write_slots`` / ``owned_mask`` on a device tensor equal ``SharedKVLayout`` on numpy.

    Slots that ``dtype`` cannot hold are dropped first (uint8: negatives; narrow types: big slots).
    """
    info = torch.iinfo(dtype)
    keep = slots[(slots >= info.min) & (slots <= info.max)]
    ref_in = keep.astype(np.dtype(str(dtype).removeprefix("torch.")))
    x = torch.from_numpy(ref_in.copy()).to(device)
    fits = info.max >= layout.num_slots - 1  # else a result may not fit dtype: the reference decides
    for name in ("read_slots", "write_slots"):
        ref = _reference(getattr(layout, name), ref_in)
        out = torch.full_like(x, 7) if use_out else None
        if isinstance(ref, Exception):  # a result does not fit the dtype
            try:
                getattr(K, name)(layout, x, out=out)
            except type(ref) as e:
                assert "does not fit" in str(e) and "does not fit" in str(ref)
            else:
                raise AssertionError(f"{name}: expected {ref!r}")
            continue
        got = getattr(K, name)(layout, x, out=out)
        assert got.dtype == dtype and got.shape == x.shape and got.device == x.device
        assert out is None or got.data_ptr() == out.data_ptr()
        assert np.array_equal(got.cpu().numpy(), ref), (name, fits)
    for rank in {0, layout.cp_size - 1, layout.cp_size // 2}:
        out = torch.ones(x.shape, dtype=torch.bool, device=device) if use_out else None
        got = K.owned_mask(layout, x, rank, out=out)
        assert got.dtype == torch.bool and got.shape == x.shape
        assert np.array_equal(got.cpu().numpy(), layout.owned_mask(ref_in, rank))


def _reference(fn, slots: np.ndarray):
    try:
        return fn(slots)
    except Exception as e:  # the reference's LayoutError: the kernel entry point must raise the same
        return e


def check_rerange(
    batch: Batch, width: int, dtype: torch.dtype, device, seed: int, use_out: bool = False
) -> None:
    """``all_gather_rerange`` equals ``gathered[gather_index]`` and the inverse ``zeros; [gather_index] = flat``,
    bit for bit; and the inverse of the rerange gives back the gathered rows with the padding zeroed."""
    plan = batch.plan
    C, M, N = plan.config.cp_size, plan.max_rank_tokens, plan.num_tokens
    gathered = random_rows(C * M, width, dtype, seed, device)
    out = torch.empty((N, width), dtype=dtype, device=device) if use_out else None
    flat = K.all_gather_rerange(gathered, plan, out=out)
    assert flat.shape == (N, width) and flat.dtype == dtype and flat.device == gathered.device
    assert out is None or flat.data_ptr() == out.data_ptr()
    g = bits(gathered)
    assert np.array_equal(bits(flat), g[plan.gather_index])
    out = torch.empty((C * M, width), dtype=dtype, device=device) if use_out else None
    back = K.all_gather_rerange_inverse(flat, plan, out=out)
    expected = np.zeros_like(g)
    expected[plan.gather_index] = bits(flat)
    assert np.array_equal(bits(back), expected)
    padding = np.ones(C * M, dtype=bool)
    padding[plan.gather_index] = False
    assert np.array_equal(bits(back)[~padding], g[~padding]) and not bits(back)[padding].any()
