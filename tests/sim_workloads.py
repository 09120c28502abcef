"""Random small simulator workloads for the property tests of the scheduler (``tests/unit/sim/``): a
``SimConfig`` over small pools (1-8 ranks, P in {1, 2, 3, 4, 16}, equal or unequal lanes down to 2 pages,
chunk and batch limits, logits budgets, host tier, colocated decode, MTP) and 1-24 requests, some
sharing a first block."""

from hypothesis import strategies as st

from cpkv.sim.config import SimConfig
from cpkv.sim.trace import Request


@st.composite
def workloads(draw, max_draft_tokens: int = 4, max_requests: int = 24):
    """``(SimConfig, [Request])``; ``max_draft_tokens``: the largest MTP K drawn (0: plain decode)."""
    C = draw(st.integers(1, 8))
    P = draw(st.sampled_from([1, 2, 3, 4, 16]))
    caps = draw(st.one_of(st.integers(2, 12), st.lists(st.integers(2, 12), min_size=C, max_size=C)))
    budget = draw(st.one_of(st.just(0), st.integers(2 * P, 300 * P * P)))
    cfg = SimConfig(
        cp_size=C,
        page_size=P,
        pages_per_lane=caps,
        chunk_size=draw(st.integers(1, 6 * P)),
        max_batch_tokens=draw(st.integers(1, 12 * P)),
        max_running=draw(st.integers(1, 6)),
        host_pages_per_lane=draw(st.sampled_from([0, 4, 64])),
        colocated_decode=draw(st.booleans()),
        spec_draft_tokens=draw(st.sampled_from([0, 0, *range(1, max_draft_tokens + 1)])),
        spec_accept_rate=draw(st.sampled_from([0, 0.5, 1])),
        logits_budget_mb=budget * 4 / 2**20,
        livelock_steps=48,
    )
    reqs, t = [], 0.0
    for i in range(draw(st.integers(1, max_requests))):
        length = draw(st.integers(1, 8 * P))
        shared = draw(st.sampled_from([(), (0,), (1,)]))  # a shared first block, or fresh blocks
        ids = (shared + tuple(range(100 + 10 * i, 110 + 10 * i)))[: -(-length // 512)]
        t += draw(st.sampled_from([0.0, 1.0, 40.0]))
        reqs.append(Request(i, t, length, draw(st.integers(0, 2 * P)), ids))
    return cfg, reqs
