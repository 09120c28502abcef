"""KV storage designs side by side (SPEC C-STORAGE, issue 26): each design's capacity, placement and cache unit,
its traffic against a token-by-token oracle, no page leaked under any of them, replicated at C=1 is
owner-lane at C=1, and ``--kv-storage`` through the CLI."""

import csv
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpkv.cli import main
from cpkv.errors import ConfigError
from cpkv.sim.config import KV_STORAGE_DESIGNS, SimConfig, check_designs
from cpkv.sim.engine import PolicyRun
from cpkv.sim.report import REPORT_FIELDS, STORAGE_FIELDS, format_value
from cpkv.sim.runner import runs
from cpkv.sim.storage import build_storage
from cpkv.sim.storage.recompute import RecomputeCounter
from cpkv.sim.trace import Request, prompt_token_ids
from cpkv.sim.workload import build_workload
from extras import COST
from sim_workloads import workloads

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-STORAGE")]

ROW, LAYERS, TOPK = (
    576 * 2 + 128 + 4,
    61,
    2048,
)  # DeepSeek-V3.2's KV row bytes per token and layer, layers, top-k
GATHER_ROW = (576 + 128) * 2  # a row as SGLang all-gathers it: latent and index key, both bf16
REASONS = {"pool", "lane", "logits_budget"}


def _design(name, cfg, policy="balanced"):
    return build_storage(name, cfg, policy, PolicyRun(cfg, policy, []).cost)


# ------------------------------------------------------------------------------------------ the examples
@pytest.mark.parametrize(
    ("pages", "want"),
    [
        (
            8,
            {
                "owner-lane": 31 * 16,
                "replicated": 7 * 16,
                "interleaved": 31 * 16,
                "interleaved-vblock": 7 * 64,
            },
        ),
        # unequal ranks: a page every rank stores fits the smallest rank's memory
        (
            (9, 10, 10, 10),
            {
                "owner-lane": 38 * 16,
                "replicated": 8 * 16,
                "interleaved": 38 * 16,
                "interleaved-vblock": 8 * 64,
            },
        ),
    ],
)
def test_capacity_of_each_design_with_the_same_hbm_per_rank(pages, want):
    # C=4, P=16: owner lanes and interleaving hold C * Q pages (page 0 reserved), replicated Q, virtual blocks
    # Q blocks of P * C tokens
    cfg = SimConfig(cp_size=4, page_size=16, pages_per_lane=pages)
    assert {d: _design(d, cfg).capacity_tokens() for d in KV_STORAGE_DESIGNS} == want


def test_interleaved_places_position_page_j_on_rank_b_plus_j():
    # C=4, P=1, Q=4: free [3, 4, 4, 4]. Two fresh requests of 3 and 2 tokens in one batch: the first starts on
    # the lane with the most free pages (lane 1, the lower of the ties), the second on lane 0 (free [3, 3, 3, 3]
    # after the first). The compute plan stays the zigzag (rotation phases 0 and 1): storage is not compute.
    s = _design("interleaved", SimConfig(cp_size=4, page_size=1, pages_per_lane=4))
    plan = s.alloc.plan_extend([0, 0], [3, 2], [-1, -1])
    assert plan.page_owners.tolist() == [1, 2, 3, 0, 1]
    assert plan.token_owner.tolist() == [0, 1, 2, 1, 2]
    a = s.alloc.allocate(plan, [-1, -1])
    assert (a.new_pages % 4).tolist() == [
        1,
        2,
        3,
        0,
        1,
    ] and a.out_cache_loc_cpu.tolist() == a.new_pages.tolist()
    # a later chunk of the first request continues its rotation after its last page (lane 3): lanes 0, 1
    nxt = s.alloc.alloc_extend([3], [2], [int(a.out_cache_loc_cpu[2])])
    assert (nxt.new_pages % 4).tolist() == [0, 1]


def test_one_pool_designs_allocate_in_their_own_pages():
    # C=2, P=2: replicated takes pages of 2 tokens from one lane; a virtual block holds 4 tokens (2 per rank),
    # so a 6-token prompt takes 2 blocks; the compute plan is the zigzag of 3 pages over the 2 ranks either way
    cfg = SimConfig(cp_size=2, page_size=2, pages_per_lane=8)
    rep, vb = _design("replicated", cfg), _design("interleaved-vblock", cfg)
    a = rep.alloc.alloc_extend([0], [6], [-1])
    assert a.new_pages.tolist() == [1, 2, 3] and a.out_cache_loc_cpu.tolist() == [2, 3, 4, 5, 6, 7]
    b = vb.alloc.alloc_extend([0], [6], [-1])
    assert b.new_pages.tolist() == [1, 2] and b.out_cache_loc_cpu.tolist() == [4, 5, 6, 7, 8, 9]
    for x in (a, b):
        assert x.plan.token_owner.tolist() == [0, 0, 1, 1, 1, 1] and x.plan.per_rank_tokens.tolist() == [2, 4]
    assert b.plan.page_indptr.tolist() == [0, 2] and rep.used_pages_per_rank().tolist() == [3, 3]
    assert vb.used_pages_per_rank().tolist() == [2, 2]  # a block is one physical page on each rank


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.sampled_from([1, 2, 3]), st.data())
def test_interleaved_pages_of_a_request_are_cyclic_over_its_chunks(C, P, data):
    # every request's position-pages lie on (b + j) % C for its own b, however its chunks and batch mates fall
    s = _design("interleaved", SimConfig(cp_size=C, page_size=P, pages_per_lane=400))
    lengths = data.draw(st.lists(st.integers(1, 12 * P), min_size=1, max_size=5))
    done, slots = [0] * len(lengths), [[] for _ in lengths]
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        batch = [i for i, (d, n) in enumerate(zip(done, lengths, strict=True)) if d < n]
        ext = [min(lengths[i] - done[i], data.draw(st.integers(1, 4 * P))) for i in batch]
        a = s.alloc.alloc_extend(
            [done[i] for i in batch], ext, [slots[i][-1] if slots[i] else -1 for i in batch]
        )
        out = a.out_cache_loc_cpu.tolist()
        for i, n in zip(batch, ext, strict=True):
            slots[i] += out[:n]
            out = out[n:]
            done[i] += n
    for row in slots:
        lanes = [slot // P % C for slot in row[::P]]
        assert lanes == [(lanes[0] + j) % C for j in range(len(lanes))]
        assert [slot // P for slot in row] == [row[t - t % P] // P for t in range(len(row))]  # one page per P


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


# ------------------------------------------------------------------------ replicated at C=1 is owner-lane
@pytest.mark.parametrize(
    ("workload", "settings_"),
    [
        ("synthetic", dict(pages_per_lane=300, chunk_size=512)),
        ("tiny-chunks-reload", dict(colocated_decode=True)),
        (
            "synthetic",
            dict(
                pages_per_lane=200,
                chunk_size=256,
                spec_draft_tokens=3,
                host_pages_per_lane=64,
                logits_budget_mb=1.0,
            ),
        ),
    ],
)
def test_replicated_at_one_rank_is_owner_lane_at_one_rank(workload, settings_):
    spec = build_workload(workload, num_requests=40, seed=2)
    cfg = SimConfig.for_workload(spec, cp_size=1, page_size=16, **settings_)
    a = PolicyRun(cfg, "balanced", spec.requests).run()
    b = PolicyRun(cfg, "balanced", spec.requests, kv_storage="replicated").run()
    for m in (a.metrics, b.metrics):
        m.pop("sim_wall_s")
    assert a.metrics.pop("kv_storage") == "owner-lane" and b.metrics.pop("kv_storage") == "replicated"
    assert a.metrics == b.metrics  # every report field
    assert a.times_ms.tolist() == b.times_ms.tolist() and a.used.tolist() == b.used.tolist()
    assert a.metrics["evicted_pages"] > 0 or a.metrics["cache_hit_tokens"] > 0  # the cache was exercised


# --------------------------------------------------------------------------- no page leaked, no livelock
@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads(max_draft_tokens=3, max_requests=20))
def test_no_page_leaks_and_every_request_ends_under_every_design(case):
    cfg, reqs = case
    for design in KV_STORAGE_DESIGNS:
        run = PolicyRun(cfg, "balanced", reqs, kv_storage=design)
        m = run.run().metrics
        assert not m["livelock_detected"], (design, m["livelock"])
        assert m["requests_finished"] + m["requests_rejected"] == len(reqs), design
        assert set(m["rejection_reasons"]) <= REASONS
        assert m["leaked_pages"] == 0, design
        # every request gone: the pool holds exactly the cache's pages, lane by lane
        assert run.alloc.used_pages_per_lane().tolist() == run.cache.cached_pages_per_lane().tolist(), design
        assert 0 <= m["prefill_tokens_recomputed"] <= m["prefill_tokens"]


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


def test_measured_model_prices_the_all_gather_from_its_nccl_tables():
    COST.require()
    from cpkv.cost import MeasuredCost, MeasuredSpec
    from cpkv.sim.storage.traffic import KVTraffic

    cost = MeasuredCost.load(MeasuredSpec(), 8)
    t = KVTraffic(cost, 8)
    assert (t.layers, t.row_bytes, t.gather_row_bytes, t.topk) == (61, ROW, GATHER_ROW, 2048)
    assert t.allgather_ms(1024) == pytest.approx(cost.kv_allgather_ms(1024))
    assert t.provenance()["comm"] == "the measured NCCL tables"


# ---------------------------------------------------------------------------------- the report's figures
def test_recomputed_tokens_are_the_computed_pages_the_cache_no_longer_had():
    c = RecomputeCounter(page_size=4)
    a = prompt_token_ids(Request(0, 0.0, 12, 0, (5,)))
    assert c.admitted(0, a, 0) == 0  # nothing computed yet
    c.retired(0, a, 12)  # 3 pages computed
    b = prompt_token_ids(Request(1, 0.0, 14, 0, (5,)))  # shares all 12 tokens: pages of b[:-1] -> 3
    assert c.admitted(1, b, 12) == 0 and c.admitted(1, b, 4) == 8 and c.admitted(1, b, 0) == 12
    other = prompt_token_ids(Request(2, 0.0, 14, 0, (6,)))
    assert c.admitted(2, other, 0) == 0
    assert c.admitted(3, a, 0) == 8  # a's own last token is never matched: its first 2 pages
    assert c.tokens == 8 + 12 + 8
    c.retired(2, other, 6)  # a rejected request hands over what it computed: one page
    assert c.admitted(4, prompt_token_ids(Request(4, 0.0, 9, 0, (6,))), 0) == 4


def test_runs_and_labels():
    assert runs(["rotation", "balanced"], ["owner-lane"]) == [
        ("rotation", "owner-lane", "rotation"),
        ("balanced", "owner-lane", "balanced"),
    ]
    assert [label for label, _, _ in runs(["balanced"], ["replicated", "owner-lane"])] == [
        "replicated",
        "owner-lane/balanced",
    ]
    assert check_designs(["interleaved", "all"]) == [
        "interleaved",
        "owner-lane",
        "replicated",
        "interleaved-vblock",
    ]
    with pytest.raises(ConfigError, match="'striped' is unknown"):
        check_designs(["striped"])
    assert format_value("kv_allgather_bytes_per_rank", 9_567_900_000_000) == "9,567.90 GB"


@pytest.mark.slow
def test_cli_kv_storage_all_keys_each_design(tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(
        [
            "simulate",
            "--workload",
            "synthetic",
            "--max-requests",
            "20",
            "--cp-size",
            "2",
            "--page-size",
            "64",
            "--pages-per-lane",
            "2000",
            "--kv-storage",
            "all",
            "--policy",
            "balanced",
            "--policy",
            "rotation",
            "--no-progress",
            "--cost-model",
            "illustrative",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    labels = ["owner-lane/balanced", "owner-lane/rotation", "replicated", "interleaved", "interleaved-vblock"]
    assert list(report["policies"]) == labels and report["status"] == "complete"
    assert report["config"]["runs"] == labels and report["config"]["kv_storage"] == list(KV_STORAGE_DESIGNS)
    assert [p["kv_storage"] for p in report["policies"].values()] == [
        d for d in KV_STORAGE_DESIGNS for _ in range(2 if d == "owner-lane" else 1)
    ]
    assert all(p["requests_finished"] == 20 for p in report["policies"].values())
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["policy"] for r in rows] == labels and list(rows[0])[1:] == [*REPORT_FIELDS, *STORAGE_FIELDS]
    assert (out / "storage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "kv_capacity_tokens" in table and "interleaved-vblock" in table
    # one design, owner-lane: the report of a run without designs (plain policy keys, no storage figure)
    plain = tmp_path / "p"
    assert (
        main(
            [
                "simulate",
                "--workload",
                "synthetic",
                "--max-requests",
                "5",
                "--cp-size",
                "2",
                "--policy",
                "rotation",
                "--no-progress",
                "--cost-model",
                "illustrative",
                "--out",
                str(plain),
            ]
        )
        == 0
    )
    report = json.loads((plain / "report.json").read_text())
    assert list(report["policies"]) == ["rotation"] and "runs" not in report["config"]
    assert sorted(p.name for p in plain.iterdir()) == [
        "config.json",
        "lanes.png",
        "report.json",
        "summary.csv",
    ]
    assert list(next(csv.DictReader((plain / "summary.csv").open())))[1:] == list(REPORT_FIELDS)
    capsys.readouterr()
    assert main(["simulate", "--kv-storage", "striped", "--no-progress", "--out", str(tmp_path / "x")]) == 2
    assert "striped" in capsys.readouterr().err
