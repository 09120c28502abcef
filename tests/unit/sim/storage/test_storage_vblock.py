"""The interleaved-vblock design (SPEC C-STORAGE): its cache unit is a virtual block of ``P * C`` tokens, so
every prefix hit is whole blocks and the rest is recomputed."""

import pytest

from cpkv.sim.config import SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.trace import Request

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]


def test_virtual_block_hits_are_whole_blocks():
    # C=2, P=4 (blocks of 8 tokens). B's prompt extends A's 524 tokens: owner-lane (cache unit one page) hits
    # all 524, the virtual-block cache only 520 (65 blocks): every match a multiple of P * C. C shares B's
    # first 530 tokens; its 529 matchable ones hold 132 pages and 66 blocks: 528 tokens either way.
    reqs = [Request(0, 0.0, 524, 0, (7, 9)), Request(1, 1e5, 600, 0, (7, 9)), Request(2, 2e5, 530, 0, (7, 9))]
    cfg = SimConfig(cp_size=2, page_size=4, pages_per_lane=400, chunk_size=256)
    hits = {}
    for design in ("owner-lane", "interleaved-vblock"):
        run = PolicyRun(cfg, "balanced", reqs, kv_storage=design)
        seen, admitted = [], run.storage.admitted
        run.storage.admitted = lambda r, seen=seen, admitted=admitted: (seen.append(r.kv.length), admitted(r))
        m = run.run().metrics
        hits[design] = (seen, m["cache_hit_tokens"], m["prefill_tokens_recomputed"])
    assert hits["owner-lane"] == ([0, 524, 528], 1052, 0)
    assert hits["interleaved-vblock"] == ([0, 520, 528], 1048, 4)  # B recomputes 4 tokens lost to the unit
