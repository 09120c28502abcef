"""KV traffic of each storage design (SPEC C-STORAGE): every prefill step's remote reads (owner-lane) or
all-gather bytes and time (the others) against a token-by-token oracle, and the measured model's pricing."""

import numpy as np
import pytest

from cpkv.sim.config import KV_STORAGE_DESIGNS, SimConfig
from cpkv.sim.engine import PolicyRun
from cpkv.sim.trace import Request
from extras import COST

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]

ROW, LAYERS, TOPK = (
    576 * 2 + 128 + 4,
    61,
    2048,
)  # DeepSeek-V3.2's KV row bytes per token and layer, layers, top-k
GATHER_ROW = (576 + 128) * 2  # a row as SGLang all-gathers it: latent and index key, both bf16


# ------------------------------------------------------------------------------ traffic, token by token
def _capture(run):
    """Snapshots ``(rows, allocation, bytes before)`` of every prefill step's traffic call of ``run``."""
    steps, count = [], run.storage.step_traffic
    t = run.storage.traffic

    def wrapped(rows, allocation):
        before = (t.allgather_bytes, t.read_bytes.copy(), t.exposed_ms)
        serial = count(rows, allocation)
        steps.append(
            (
                [np.array(r) for r in rows],
                allocation,
                before,
                (t.allgather_bytes, t.read_bytes.copy(), t.exposed_ms),
                serial,
            )
        )
        return serial

    run.storage.step_traffic = wrapped
    return steps


def _positions(rows, plan, out, i):
    """Slot of every position of request i after the step (prefix slots, then the extend's)."""
    L0, a, b = int(plan.prefix_lens[i]), int(plan.extend_indptr[i]), int(plan.extend_indptr[i + 1])
    return list(rows[i][:L0]) + out[a:b].tolist()


def _reads_oracle(rows, plan, out, C, P):
    """Bytes per layer rank r reads: for each request, the positions before its last query there whose page's
    lane is not r; index keys of all of them, latents of at most n * topk."""
    got = [0] * C
    owner = plan.token_owner.tolist()
    for i in range(plan.num_requests):
        slots = _positions(rows, plan, out, i)
        L0, a = int(plan.prefix_lens[i]), int(plan.extend_indptr[i])
        E = int(plan.extend_lens[i])
        for r in range(C):
            mine = [L0 + t for t in range(E) if owner[a + t] == r]
            if not mine:
                continue
            v = sum(1 for p in range(max(mine) + 1) if slots[p] // P % C != r)
            got[r] += v * 132 + min(v, len(mine) * TOPK) * 1152
    return got


def _prefix_rows_oracle(rows, plan, C, P, unit, vblock):
    """Rows per rank of the prefix gather: the batch's distinct physical prefix pages, per rank, at most."""
    pages = set()
    for i in range(plan.num_requests):
        for p in range(int(plan.prefix_lens[i])):
            slot = int(rows[i][p])
            pages.add((slot // unit, (p // P) % C) if vblock else (slot // P, slot // P % C))
    per_rank = [sum(1 for _, r in pages if r == k) for k in range(C)]
    return max(per_rank, default=0) * P


@pytest.mark.parametrize("design", KV_STORAGE_DESIGNS)
def test_traffic_of_every_step_matches_the_token_oracle(design):
    # 12 prompts of 200-871 tokens, two in three sharing a first block, chunks of at most 160 tokens: steps
    # read cached prefixes and earlier chunks
    reqs = [
        Request(i, 30.0 * i, 200 + 61 * i, 0, ((1,) if i % 3 else ()) + (100 + i, 200 + i)) for i in range(12)
    ]
    reqs = [
        Request(r.req_id, r.arrival_ms, r.input_length, 0, r.hash_ids[: -(-r.input_length // 512)])
        for r in reqs
    ]
    cfg = SimConfig(cp_size=4, page_size=8, pages_per_lane=300, chunk_size=160, max_batch_tokens=320)
    run = PolicyRun(cfg, "balanced", reqs, kv_storage=design)
    steps = _capture(run)
    m = run.run().metrics
    C, P = 4, 8
    assert steps and m["requests_finished"] == 12
    prefixes = 0
    for rows, a, before, after, serial in steps:
        plan, out = a.plan, a.out_cache_loc_cpu
        prefixes += int(plan.prefix_lens.sum() > 0)
        reads = (after[1] - before[1]).tolist()
        gathered = after[0] - before[0]
        M = int(plan.per_rank_tokens.max())
        if design == "owner-lane":
            assert reads == [LAYERS * x for x in _reads_oracle(rows, plan, out, C, P)]
            assert gathered == 0 and serial == 0.0
            continue
        prefix = 0
        if design != "replicated":
            unit = P * C if design == "interleaved-vblock" else P
            prefix = _prefix_rows_oracle(rows, plan, C, P, unit, design == "interleaved-vblock")
        assert reads == [0] * C
        assert gathered == (C - 1) * (M + prefix) * GATHER_ROW * LAYERS
        # the illustrative link: 10 us + the bytes each rank receives at 100 GB/s, per layer
        assert serial == pytest.approx(LAYERS * (0.01 + (C - 1) * M * GATHER_ROW / 1e8))
        assert after[2] - before[2] == pytest.approx(serial)
    assert prefixes > 0  # some steps read a cached or earlier-chunk prefix
    assert m["kv_allgather_bytes_per_rank"] == (steps[-1][3][0] if design != "owner-lane" else 0)


def test_owner_lane_reads_counted_in_batches_equal_the_steps_counted_one_at_a_time(monkeypatch):
    """``owner_lane_layer_bytes`` counts the kept steps together (requests, runs and pages of many steps
    concatenated); the totals equal counting each step as it comes (the oracle test's per-step reads)."""
    from cpkv.sim.storage import traffic

    reqs = [
        Request(i, 20.0 * i, 150 + 97 * i, 0, ((1,) if i % 2 else (2,)) + (100 + i, 200 + i, 300 + i))
        for i in range(16)
    ]
    reqs = [
        Request(r.req_id, r.arrival_ms, r.input_length, 0, r.hash_ids[: -(-r.input_length // 512)])
        for r in reqs
    ]
    cfg = SimConfig(cp_size=4, page_size=8, pages_per_lane=400, chunk_size=160, max_batch_tokens=320)
    totals = []
    for batch in (1, 5, 1024):  # one step at a time, a few, the whole replay in one batch
        monkeypatch.setattr(traffic, "READ_BATCH", batch)
        run = PolicyRun(cfg, "rotation", reqs, kv_storage="owner-lane")
        m = run.run().metrics
        t = run.storage.traffic
        totals.append((t.read_bytes.tolist(), t.comm_ms, m["kv_remote_read_bytes_per_rank"]))
    assert totals[0][0][0] > 0 and totals[0] == totals[1] == totals[2]


def test_measured_model_prices_the_all_gather_from_its_nccl_tables():
    COST.require()
    from cpkv.cost import MeasuredCost, MeasuredSpec
    from cpkv.sim.storage.traffic import KVTraffic

    cost = MeasuredCost.load(MeasuredSpec(), 8)
    t = KVTraffic(cost, 8)
    assert (t.layers, t.row_bytes, t.gather_row_bytes, t.topk) == (61, ROW, GATHER_ROW, 2048)
    assert t.allgather_ms(1024) == pytest.approx(cost.kv_allgather_ms(1024))
    assert t.provenance()["comm"] == "the measured NCCL tables"


def test_remote_reads_priced_in_batches_add_up_as_priced_one_step_at_a_time(monkeypatch):
    from cpkv.sim.storage import traffic

    monkeypatch.setattr(traffic, "READ_BATCH", 8)
    t, C = traffic.KVTraffic(None, 4), 4
    steps = np.random.default_rng(7).integers(0, 10**9, size=(50, C))
    steps[::7] = 0
    comm, read = 0.0, np.zeros(C, dtype=np.int64)
    for i, layer in enumerate(steps):
        t.add_reads(layer)
        read += layer * t.layers
        if layer.any():
            comm += float((t.layers * np.asarray(t.comm.remote_read_ms(layer.astype(np.float64), C))).max())
        if i % 11 == 5:
            comm += t.add_allgathers(100, 30) + t.allgather_ms(30)
        if i % 13 == 0:
            assert t.comm_ms == comm
    assert t.comm_ms == comm and t.read_bytes.tolist() == read.tolist()
