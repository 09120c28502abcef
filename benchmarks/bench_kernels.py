"""cpkv.kernels on a CUDA device: achieved bytes/s against the memory bandwidth and the torch index-op path.

    python benchmarks/bench_kernels.py [--quick] [--json PATH]

Per kernel and size (1M, 4M, 16M tokens; --quick: 64K): the median time of the Triton kernel (CUDA events,
after a warm-up that compiles it), the bytes it must move (reads + writes), GB/s, that as a share of the
device's peak bandwidth (memory clock x bus width, from its properties) and of a measured device copy, and
the same work on the torch path (what the code does without the kernel) with the kernel's speed-up.
``fill_out_cache_loc`` is timed twice: the kernel alone (run table already on the device), and the whole
call (numpy run table on the host, one host-to-device copy, the launch). On a machine without CUDA it
prints "no CUDA device" and exits 0: the kernels' correctness on the CPU is tests/unit/kernels' job.
"""

from __future__ import annotations

import statistics

import numpy as np
import torch
from _common import parser, print_table, write_json

from cpkv import CPConfig, SharedKVLayout, plan_batch
from cpkv import kernels as K
from cpkv.kernels.slots import fill_table, launch_fill
from cpkv.slots import extend_slots

C, P = 8, 64
# GPU clock cycles (~50 ms at 2 GHz) that hold the stream busy: longer than the host takes to queue the calls
_BACKLOG_CYCLES = 100_000_000


def cuda_ms(fn, repeats: int) -> float:
    """Median milliseconds of ``fn()`` on the current stream, after two warm-up calls: CUDA events around
    each call, all calls queued back to back behind a ``torch.cuda._sleep`` of ``_BACKLOG_CYCLES`` and one
    synchronize at the end. The stream is busy while the host queues the calls, so each interval holds the
    device's work alone, also where a launch takes the host longer than the kernel takes the device (on
    an idle stream a start event fires as it is recorded and the host's launch lands inside the interval:
    on an H200 fill_out_cache_loc's kernel at 1M tokens timed 35 us so, 11.6 us behind the sleep). A call
    that waits for the device itself (a blocking host-to-device copy) is timed with its host work."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)
    ]
    torch.cuda._sleep(_BACKLOG_CYCLES)
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def peak_bytes_per_s() -> float | None:
    """Theoretical DRAM bandwidth: 2 x memory clock x bus width (None when torch does not report them)."""
    props = torch.cuda.get_device_properties(0)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None


def copy_bytes_per_s(repeats: int) -> float:
    """Measured bandwidth of a 1 GiB device-to-device copy (bytes read + written per second)."""
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / (cuda_ms(lambda: dst.copy_(src), repeats) / 1e3)


def batch(tokens: int):
    """16 requests of tokens/16 each, half with an unaligned cached prefix; returns (plan, last, pages)."""
    rng = np.random.default_rng(tokens)
    L0 = np.where(np.arange(16) % 2 == 0, 0, rng.integers(1, 10_000, 16))
    plan = plan_batch(L0, np.full(16, tokens // 16), CPConfig(C, P), head_owners=rng.integers(0, C, 16))
    pages = rng.permutation(plan.page_owners.shape[0]) + 1
    last = np.where(L0 > 0, P * rng.integers(1, 1 << 20, 16) + (L0 - 1) % P, -1)
    return plan, last, pages


def cases(tokens: int):
    """(kernel, detail, bytes moved, kernel fn, torch-path fn) for one size."""
    plan, last, pages = batch(tokens)
    N = plan.num_tokens
    table = torch.from_numpy(fill_table(plan, last, pages)).cuda()
    out = torch.empty(N, dtype=torch.int64, device="cuda")
    fill_bytes = 8 * N + 8 * pages.shape[0]
    to_device = lambda: torch.from_numpy(extend_slots(plan, last, pages)).cuda()  # noqa: E731
    yield (
        "fill_out_cache_loc (kernel)",
        "int64",
        fill_bytes,
        lambda: launch_fill("triton", table, out, plan),
        to_device,
    )
    yield (
        "fill_out_cache_loc (call)",
        "int64",
        fill_bytes,
        lambda: K.fill_out_cache_loc(plan, last, pages, out=out),
        to_device,
    )
    layout = SharedKVLayout(C, P, -(-N // (C * P)) + 1)
    slots = torch.randint(0, layout.num_slots, (N,), device="cuda")
    res = torch.empty_like(slots)
    mask = torch.empty(N, dtype=torch.bool, device="cuda")
    for name in ("read_slots", "write_slots"):
        yield (
            name,
            "int64",
            16 * N,
            lambda n=name: getattr(K, n)(layout, slots, out=res, check=False),
            lambda n=name: getattr(layout, n)(slots),
        )
    yield (
        "owned_mask",
        "int64",
        9 * N,
        lambda: K.owned_mask(layout, slots, 3, out=mask, check=False),
        lambda: layout.owned_mask(slots, 3),
    )
    idx = torch.from_numpy(plan.gather_index.copy()).cuda()
    for width, dtype in ((576, torch.bfloat16), (576, torch.float32), (128, torch.bfloat16)):
        row = width * torch.empty(0, dtype=dtype).element_size()
        if 2 * (C * plan.max_rank_tokens + N) * row > 0.6 * torch.cuda.get_device_properties(0).total_memory:
            continue  # two buffers each way (kernel and torch outputs) must fit
        gathered = torch.randn(C * plan.max_rank_tokens, width, device="cuda").to(dtype)
        flat = torch.empty(N, width, dtype=dtype, device="cuda")
        back = torch.empty_like(gathered)
        detail = f"{width} x {str(dtype).removeprefix('torch.')}"
        yield (
            "all_gather_rerange",
            detail,
            2 * N * row,
            lambda g=gathered, f=flat: K.all_gather_rerange(g, plan, out=f),
            lambda g=gathered: g.index_select(0, idx),
        )
        yield (
            "rerange_inverse",
            detail,
            (N + back.shape[0]) * row,
            lambda f=flat, b=back: K.all_gather_rerange_inverse(f, plan, out=b),
            lambda f=flat, b=back: b.zero_().index_copy_(0, idx, f),
        )
        del gathered, flat, back


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: bench_kernels measures the Triton kernels on a GPU; nothing to measure here")
        write_json(args.json, {"benchmark": "kernels", "quick": args.quick, "cuda": False, "cases": {}})
        return
    stack = K.require_kernel_version()
    sizes, repeats = ([1 << 16], 5) if args.quick else ([1 << 20, 1 << 22, 1 << 24], 20)
    peak, copy = peak_bytes_per_s(), copy_bytes_per_s(repeats)
    rows, out = [], {}
    for tokens in sizes:
        for name, detail, nbytes, kernel, torch_path in cases(tokens):
            t, t_torch = cuda_ms(kernel, repeats), cuda_ms(torch_path, repeats)
            rate = nbytes / (t / 1e3)
            share = f"{100 * rate / peak:.0f}" if peak else "-"
            rows.append(
                [
                    name,
                    detail,
                    tokens,
                    nbytes / 1e6,
                    t,
                    rate / 1e9,
                    share,
                    f"{100 * rate / copy:.0f}",
                    t_torch,
                    t_torch / t,
                ]
            )
            out[f"{name} {detail} {tokens}"] = dict(
                tokens=tokens, bytes=nbytes, ms=t, torch_ms=t_torch, bytes_per_s=rate
            )
        torch.cuda.empty_cache()
    title = (
        f"cpkv.kernels on {torch.cuda.get_device_name(0)} (triton {stack.triton}, C={C}, P={P}); peak "
        f"{peak / 1e9 if peak else float('nan'):,.0f} GB/s, measured copy {copy / 1e9:,.0f} GB/s (median)"
    )
    header = [
        "kernel",
        "elements",
        "tokens",
        "MB moved",
        "ms",
        "GB/s",
        "% peak",
        "% copy",
        "torch ms",
        "x torch",
    ]
    print_table(title, header, rows)
    write_json(
        args.json,
        {
            "benchmark": "kernels",
            "quick": args.quick,
            "cuda": True,
            "device": torch.cuda.get_device_name(0),
            "peak_bytes_per_s": peak,
            "copy_bytes_per_s": copy,
            "cases": out,
        },
    )


if __name__ == "__main__":
    main()
