"""SharedKVLayout.read_slots / write_slots on 16M slots (numpy, torch CPU): time, ratio to the memory bound.

    python benchmarks/bench_layout.py [--quick] [--json PATH]

Slots: uniform over a pool of C=8 x Q x P=64 = 16M slots, every 1000th slot the -1 padding sentinel.
The memory bound is ``np.copyto`` of the output bytes into a preallocated buffer; "fresh copy" is
``src.copy()``, the bound plus the first touch of a new output array, which a translation that returns a
new array pays. "out=" times the same translation into a preallocated (already touched) output, as a
caller that translates every step into the same buffer does: it is the figure the bound applies to.
"x bound" is the median of per-round ratios, each round timing the bound copy and the out= translation
back to back (robust to a machine whose load changes between rounds). See README.md.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from _common import copy_bound_s, fresh_copy_s, median_s, parser, print_table, write_json

from cpkv import SharedKVLayout


def paired_ratio(fn, nbytes: int, repeats: int) -> float:
    """Median over ``repeats`` rounds of (time of ``fn()``) / (time of the bound copy of ``nbytes``), the two
    timed back to back in each round."""
    src = np.arange(max(1, nbytes // 8), dtype=np.int64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    ratios = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        t1 = time.perf_counter()
        fn()
        ratios.append((time.perf_counter() - t1) / (t1 - t0))
    return statistics.median(ratios)


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    n, repeats = (1 << 16, 5) if args.quick else (1 << 24, 9)
    C, P = 8, 64
    layout = SharedKVLayout(C, P, max(1, n // (C * P)))
    slots = np.random.default_rng(0).integers(0, layout.num_slots, n, dtype=np.int64)
    slots[::1000] = -1
    inputs = {
        "numpy int64": slots,
        "numpy int32": slots.astype(np.int32),
        "torch int64": torch.from_numpy(slots),
        "torch int32": torch.from_numpy(slots.astype(np.int32)),
    }
    rows, out = [], {}
    for name, x in inputs.items():
        nbytes = x.nbytes if isinstance(x, np.ndarray) else x.numel() * x.element_size()
        bound, fresh = copy_bound_s(nbytes, repeats), fresh_copy_s(nbytes, repeats)
        dst = fn_out = None
        for op in ("read_slots", "write_slots"):
            fn = getattr(layout, op)
            dst = fn(x)  # the preallocated output, touched once
            t = median_s(lambda fn=fn, x=x: fn(x), repeats)
            t_out = median_s(lambda fn=fn, x=x, dst=dst: fn(x, out=dst), repeats)
            ratio = paired_ratio(lambda fn=fn, x=x, dst=dst: fn(x, out=dst), nbytes, repeats)
            out[f"{op} {name}"] = dict(
                slots=n, s=t, out_s=t_out, bound_s=bound, fresh_copy_s=fresh, out_x_bound=ratio
            )
            rows.append(
                [op, name, t * 1e3, fresh * 1e3, t / fresh, t_out * 1e3, n / t_out / 1e9, bound * 1e3, ratio]
            )
        del dst, fn_out
    header = [
        "op",
        "input",
        "new ms",
        "fresh copy ms",
        "x fresh",
        "out= ms",
        "Gslots/s",
        "bound ms",
        "x bound",
    ]
    title = f"SharedKVLayout(C={C}, P={P}, Q={layout.pages_per_lane}) translations (median)"
    print_table(title, header, rows)
    write_json(args.json, {"benchmark": "layout", "quick": args.quick, "cases": out})


if __name__ == "__main__":
    main()
