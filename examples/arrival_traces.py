"""Write the README's arrival-pattern traces (issue 23) as JSONL files for ``cpkv simulate --trace``.

    .venv/bin/python examples/arrival_traces.py out/arrivals

Each prompt has its own hash block, so no prefix is shared and every figure comes from placement alone
(timestamps in ms, ``output_length`` 0: prefill only):

- ``burst512_65.jsonl``: 512 prompts of 65 tokens (one full page and one partly filled at P=64) at t = 0;
- ``burst24_65.jsonl``: 24 such prompts at t = 0, the smallest burst that tiled lanes in pairs;
- ``one_at_a_time_65_127.jsonl``: 200 prompts of 65-127 tokens (seeded), one every 25 ms;
- ``burst64_64.jsonl``: 64 one-page prompts at t = 0 (rotation's admission in a 4-page pool).

The README runs them with ``cpkv simulate --trace FILE --pages-per-lane Q --policy all`` at C=8, P=64.
"""

import json
import sys
from pathlib import Path

import numpy as np


def rows(name: str) -> list[tuple[float, int]]:
    """(timestamp ms, input_length) per request of the trace ``name``."""
    if name == "burst512_65":
        return [(0.0, 65)] * 512
    if name == "burst24_65":
        return [(0.0, 65)] * 24
    if name == "one_at_a_time_65_127":
        lengths = np.random.default_rng(7).integers(65, 127, size=200, endpoint=True)
        return [(25.0 * i, int(n)) for i, n in enumerate(lengths)]
    if name == "burst64_64":
        return [(0.0, 64)] * 64
    raise ValueError(f"unknown trace {name!r}")


NAMES = ("burst512_65", "burst24_65", "one_at_a_time_65_127", "burst64_64")


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        lines = [
            json.dumps({"timestamp": t, "input_length": n, "output_length": 0, "hash_ids": [i]})
            for i, (t, n) in enumerate(rows(name))
        ]
        (out / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        print(out / f"{name}.jsonl", len(lines), "requests")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/arrival_traces.py OUT_DIR")
    main(sys.argv[1])
