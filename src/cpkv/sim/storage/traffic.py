"""KV traffic of one prefill step under each storage design, in bytes and priced (SPEC C-STORAGE, C-COST).

Per token and layer a stored KV row is the latent (576 x 2 B, bf16) plus the index key (128 B fp8 and one
fp32 scale): 1,284 B; 61 layers (DeepSeek-V3.2; the measured tables' own figures when they price the run).
The all-gathers move what SGLang gathers, the latent and the index key in bf16 (128 x 2 B): 1,408 B a row
(aiconfigurator's docs/CONTEXT_PARALLEL_DSA_MODELING.md section 3.4, sizes found by instrumenting SGLang:
``dsa_indexer`` index key 128, ``rebuild_cp_kv_cache`` latent 576, both bf16). Owner-lane's remote reads
read the stored rows. What moves, per layer, in a prefill step whose busiest rank computes ``M`` tokens:

- **extend all-gather** (replicated, interleaved, interleaved-vblock): every rank all-gathers the rows
  the others computed, ``M`` rows per rank (NCCL pads to the largest share); each rank receives
  ``(C - 1) * M`` rows. Attention waits for it: its time is added to the step.
- **prefix gather** (interleaved, interleaved-vblock): the cached prefix is spread over the ranks, so
  each rank sends the prefix pages it stores (the batch's pages, each once) in a padded all-gather of
  ``max_r pages_r * P`` rows per rank (SGLang 0.5.23 ``PageInterleaveKVPoolMixin``). SGLang runs it a
  layer ahead on a side stream: it is priced and reported, not added to the step.
- **remote reads** (owner-lane): rank ``r`` reads, through the rank-major view (C-LAYOUT), the rows of
  other lanes its queries can see: for each request, ``V`` = the positions before the end of ``r``'s last
  run there that live on another lane. The indexer scores every visible key (``V`` index keys); sparse
  MLA reads each query's top-k latents, at most ``min(V, n_r * topk)`` distinct rows for ``n_r`` queries
  (an upper bound: dense attention would read all ``V``). So ``V * 132 + min(V, n_r * topk) * 1152`` bytes
  per layer, each counted once per step. The loads are issued by the attention kernel itself: priced
  (``CommCost.remote_read_ms``, per rank) and reported, not added to the step (the measured attention
  module is the step's attention time).

Prices come from the run's cost model: the measured NCCL tables (``cost.comm``) when it has them, else
``ILLUSTRATIVE_COMM``, a latency and a bandwidth that are not a GPU's (for tests and the illustrative
model). Decode steps are not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...cost.comm import CommCost
from ...plan import BatchPlan
from ...runs import indptr

_I64 = np.int64

LATENT_BYTES = 576 * 2
"""Bytes of one token's MLA latent row in one layer (512 + 64 rope, bf16)."""
INDEX_KEY_BYTES = 128 + 4
"""Bytes of one token's stored index key in one layer (128 fp8 values and one fp32 scale)."""
GATHER_INDEX_KEY_BYTES = 128 * 2
"""Bytes of one token's index key in one layer as SGLang all-gathers it (128 bf16 values)."""
NUM_LAYERS = 61
"""DeepSeek-V3.2's layers (the measured tables' ``num_layers`` replace it when they price the run)."""
INDEX_TOPK = 2048
"""Keys the sparse attention selects per query (DeepSeek-V3.2; the measured tables' ``index_topk``)."""

READ_BATCH = 1024
"""Steps of remote reads ``KVTraffic`` keeps before counting and pricing them in one call (owner-lane steps
keep their plans and the first slot of each page: a few MB for 1,024 steps of 16,384 tokens at C=8)."""

ILLUSTRATIVE_LATENCY_MS = 0.01
ILLUSTRATIVE_GB_PER_S = 100.0
"""The illustrative link: a collective over G ranks whose whole buffer is ``b`` bytes takes
``ILLUSTRATIVE_LATENCY_MS + b * (G - 1) / G / ILLUSTRATIVE_GB_PER_S`` (not a GPU's figures)."""


def _illustrative_sample(op: str, num_gpus: int, elements: np.ndarray) -> np.ndarray:
    share = (num_gpus - 1) / num_gpus
    return ILLUSTRATIVE_LATENCY_MS + elements * 2.0 * share / (ILLUSTRATIVE_GB_PER_S * 1e6)


def illustrative_comm() -> CommCost:
    """A ``CommCost`` on the illustrative link (``ILLUSTRATIVE_LATENCY_MS``, ``ILLUSTRATIVE_GB_PER_S``)."""
    return CommCost(_illustrative_sample)


class KVTraffic:
    """Prices and totals of one replay's KV traffic (see the module docstring).

    Args:
        cost: the run's ``StepCost``; its ``comm`` and ``tables`` (the measured model) price the traffic,
            else the illustrative link and DeepSeek-V3.2's sizes do.
        cp_size: ranks (C).

    Attributes (totals over the replay's prefill steps):
        allgather_bytes: bytes each rank received in KV all-gathers (extend and prefix).
        read_bytes: int64 ``[C]`` bytes each rank read from other lanes.
        comm_ms: sum over steps of the slowest rank's priced KV traffic, ms.
        exposed_ms: the part of it added to the steps (the extend all-gathers), ms.

    Remote reads are kept per step and counted and priced ``READ_BATCH`` steps at a time, in one call each
    (the step loop's cost), when ``read_bytes`` or ``comm_ms`` is read or an all-gather is counted: the same
    integer counts and elementwise prices, added to ``comm_ms`` in step order, so every total is what
    counting and pricing each step at once gives.
    """

    def __init__(self, cost, cp_size: int) -> None:
        tables = getattr(cost, "tables", None)
        self.comm: CommCost = getattr(cost, "comm", None) or illustrative_comm()
        self.layers = int(getattr(tables, "num_layers", NUM_LAYERS))
        self.row_bytes = int(getattr(tables, "kv_row_bytes", LATENT_BYTES + INDEX_KEY_BYTES))
        self.topk = int(getattr(tables, "index_topk", INDEX_TOPK))
        self.latent_bytes = self.row_bytes - INDEX_KEY_BYTES  # 1,152 for DeepSeek-V3.2
        self.gather_row_bytes = int(
            getattr(tables, "kv_gather_row_bytes", self.latent_bytes + GATHER_INDEX_KEY_BYTES)
        )
        self.cp_size = cp_size
        self.measured = tables is not None
        self.allgather_bytes = 0
        self._read_bytes = np.zeros(cp_size, dtype=_I64)
        self._comm_ms = 0.0
        self.exposed_ms = 0.0
        self._reads: list[np.ndarray] = []  # int64 [steps, C] blocks: per-layer bytes of steps not priced yet
        self._read_rows = 0  # steps in _reads
        self._steps: list[tuple[BatchPlan, np.ndarray]] = []  # owner-lane steps not counted yet

    @property
    def read_bytes(self) -> np.ndarray:
        """int64 ``[C]`` bytes each rank read from other lanes, over the steps so far."""
        self._price_reads()
        return self._read_bytes

    @property
    def comm_ms(self) -> float:
        """Sum over the steps so far of the slowest rank's priced KV traffic, ms."""
        self._price_reads()
        return self._comm_ms

    def allgather_ms(self, rows_per_rank: int) -> float:
        """All layers' all-gathers of ``rows_per_rank`` KV rows per rank (``gather_row_bytes`` each), ms
        (``MeasuredCost.kv_allgather_ms``)."""
        return self.layers * float(
            self.comm.allgather_ms(rows_per_rank * self.gather_row_bytes, self.cp_size)
        )

    def add_allgathers(self, extend_rows: int, prefix_rows: int = 0) -> float:
        """Count one step's all-gathers (``extend_rows`` and ``prefix_rows`` rows per rank); the extend's ms,
        which the step waits for."""
        C = self.cp_size
        self._price_reads()  # earlier steps' reads first: comm_ms adds in step order
        self.allgather_bytes += (C - 1) * (extend_rows + prefix_rows) * self.gather_row_bytes * self.layers
        serial = self.allgather_ms(extend_rows) if extend_rows else 0.0
        self.exposed_ms += serial
        self._comm_ms += serial + (self.allgather_ms(prefix_rows) if prefix_rows else 0.0)
        return serial

    def add_reads(self, layer_bytes: np.ndarray) -> None:
        """Count one step's remote reads: ``layer_bytes`` int64 ``[C]`` bytes each rank reads per layer
        (kept, priced with the next ``READ_BATCH`` steps')."""
        self._count_steps()  # the kept owner-lane steps first: steps are priced in order
        if layer_bytes.any():
            self._reads.append(layer_bytes[None, :])
            self._read_rows += 1
            if self._read_rows >= READ_BATCH:
                self._price_reads()

    def add_owner_lane_step(self, plan: BatchPlan, slots: np.ndarray) -> None:
        """Keep one owner-lane prefill step (``plan``, ``slots``: ``owner_lane_reads``'s) whose reads are
        counted, then priced, with the next ``READ_BATCH`` steps' (``owner_lane_layer_bytes``)."""
        self._steps.append((plan, slots))
        if len(self._steps) + self._read_rows >= READ_BATCH:
            self._price_reads()

    def _count_steps(self) -> None:
        """Turn the kept owner-lane steps into per-layer reads (``_reads``, those that read anything)."""
        if self._steps:
            layer = owner_lane_layer_bytes(self._steps, self)
            self._steps = []
            kept = layer[layer.any(axis=1)]
            if kept.shape[0]:
                self._reads.append(kept)
                self._read_rows += kept.shape[0]

    def _price_reads(self) -> None:
        """Add the kept steps' reads to ``read_bytes`` and their prices to ``comm_ms`` (step order)."""
        self._count_steps()
        if not self._reads:
            return
        layer = np.concatenate(self._reads) if len(self._reads) > 1 else self._reads[0]  # [steps, C]
        self._reads, self._read_rows = [], 0
        self._read_bytes += layer.sum(axis=0) * self.layers
        ms = self.layers * np.asarray(self.comm.remote_read_ms(layer.astype(np.float64), self.cp_size))
        for step_ms in ms.max(axis=1).tolist():  # one at a time: the float sum of pricing each step alone
            self._comm_ms += step_ms

    def read_layer_bytes(self, visible: np.ndarray, queries: np.ndarray) -> np.ndarray:
        """Bytes per layer of ``visible`` remote keys read for ``queries`` queries (int64 arrays of one shape):
        ``V * 132 + min(V, n * topk) * 1152`` elementwise (the latent: the row less its index key)."""
        return visible * INDEX_KEY_BYTES + np.minimum(visible, queries * self.topk) * self.latent_bytes

    def provenance(self) -> dict:
        """How the traffic is priced, for the report."""
        link = (
            "the measured NCCL tables"
            if self.measured
            else f"illustrative link: {ILLUSTRATIVE_LATENCY_MS} ms + bytes at {ILLUSTRATIVE_GB_PER_S} GB/s"
        )
        return {
            "kv_row_bytes": self.row_bytes,
            "kv_gather_row_bytes": self.gather_row_bytes,
            "num_layers": self.layers,
            "index_topk": self.topk,
            "comm": link,
        }


def position_page_slots(rows: Sequence[np.ndarray], plan: BatchPlan, out: np.ndarray) -> np.ndarray:
    """Slot of the first position of every position-page of each request of a step, after its allocation,
    concatenated in request order: int64 ``[sum k_i]``, ``k_i = ceil((L0 + E) / P)`` (a new array).

    ``rows``: each request's ``req_to_token`` row (slots of its prefix positions); ``out``: the step's
    ``out_cache_loc`` (slots of the extend, request order). Slots are page aligned, so position-page j lies in
    the page of the slot of its first position ``j * P`` (a prefix slot, else an extend slot); its lane is
    ``slot // P % C``.
    """
    P, L0, ind = plan.config.page_size, plan.prefix_lens.tolist(), plan.extend_indptr.tolist()
    parts = []
    for i, row in enumerate(rows):
        parts.append(row[0 : L0[i] : P])
        parts.append(out[ind[i] + (-L0[i] % P) : ind[i + 1] : P])  # the first new page's first slot onwards
    return np.concatenate(parts) if parts else np.zeros(0, dtype=_I64)


def owner_lane_reads(
    rows: Sequence[np.ndarray], plan: BatchPlan, out: np.ndarray, traffic: KVTraffic
) -> None:
    """Count owner-lane's remote reads of one prefill step (module docstring): for each request and each
    rank that computes some of it, the positions before the end of that rank's last run there whose page
    lives on another lane. ``rows``, ``out``: as ``position_page_slots``; ``plan``: the step's plan. The step
    is kept (its plan and its pages' slots) and counted with the next ``READ_BATCH`` steps
    (``owner_lane_layer_bytes``), as its price is."""
    if plan.config.cp_size == 1 or plan.token_runs.length.shape[0] == 0:
        return
    traffic.add_owner_lane_step(plan, position_page_slots(rows, plan, out))


def owner_lane_layer_bytes(steps: Sequence[tuple[BatchPlan, np.ndarray]], traffic: KVTraffic) -> np.ndarray:
    """Bytes per layer each rank reads from other lanes in each of ``steps`` (``(plan, position_page_slots)``
    of owner-lane prefill steps of one group, C > 1, each with tokens), int64 ``[steps, C]``: the steps'
    requests, runs and pages concatenated, so the whole batch costs some 40 numpy calls.

    For each (request, rank) pair with queries, ``end`` is the end of the rank's last run there; ``V = end -
    local``, ``local`` the positions before ``end`` whose page is on the rank's lane (whole pages counted by
    a search in the pages sorted by lane, stably, plus the part of a partly covered page on that lane).
    """
    plans = [plan for plan, _ in steps]
    C, P = plans[0].config.cp_size, plans[0].config.page_size
    runs = [plan.token_runs for plan in plans]
    B = np.array([plan.num_requests for plan in plans], dtype=_I64)
    L0 = np.concatenate([plan.prefix_lens for plan in plans])  # [Bt] over the batch's requests
    E = np.concatenate([plan.extend_lens for plan in plans])
    req = np.concatenate([r.req for r in runs]) + np.repeat(indptr(B)[:-1], [r.req.shape[0] for r in runs])
    length = np.concatenate([r.length for r in runs])  # [R]
    flat_start = np.add.accumulate(length) - length  # tokens of the batch before each run
    end = L0[req] + (flat_start - indptr(E)[req]) + length  # [R] position after each run
    b = np.zeros(L0.shape[0] * C, dtype=_I64)
    np.maximum.at(b, req * C + np.concatenate([r.owner for r in runs]), end)  # (request, rank)'s last end
    n = np.concatenate([plan.per_request_rank_tokens for plan in plans]).reshape(-1)  # [Bt * C] queries
    pair = np.flatnonzero(n)  # the (request, rank) pairs that compute
    req, rank, ends = pair // C, pair % C, b[pair]
    first = np.concatenate([slots for _, slots in steps])  # [G] first slot of each page (>= 0)
    if P & (P - 1) == 0 and C & (C - 1) == 0:  # powers of two: shift and mask, the same lanes
        lanes = ((first >> (P.bit_length() - 1)) & (C - 1)).astype(np.int16)  # [G] each page's lane
    else:
        lanes = (first // P % C).astype(np.int16)
    G = lanes.shape[0]
    order = np.argsort(lanes, kind="stable")  # pages by lane, in page order within a lane
    key = lanes[order] * _I64(G + 1) + order  # ascending: lane * (G + 1) + page
    full, part = ends // P, ends % P  # pages wholly before each end, and the tokens of the next
    base = indptr(-(-(L0 + E) // P))[req]  # each pair's request's first page
    lane_base = rank * (G + 1)
    local = (np.searchsorted(key, lane_base + base + full) - np.searchsorted(key, lane_base + base)) * P
    tail = np.minimum(base + full, max(G - 1, 0))  # the partly covered page (valid where part > 0)
    local += np.where((part > 0) & (lanes[tail] == rank), part, 0)
    layer = traffic.read_layer_bytes(ends - local, n[pair])
    step = np.repeat(np.arange(len(steps)), B)[req]
    per_step = np.bincount(step * C + rank, weights=layer, minlength=len(steps) * C)
    return per_step.astype(_I64).reshape(len(steps), C)


def prefix_gather_rows(rows: Sequence[np.ndarray], plan: BatchPlan, storage_page: int, physical) -> int:
    """Rows per rank of the padded prefix all-gather of an interleaved step: ``max_r`` (the batch's distinct
    prefix pages stored on rank r) ``* P``. ``rows``: each request's ``req_to_token`` row; ``storage_page``:
    tokens per storage page; ``physical(units, j)``: one key per physical page, ``key % C`` its rank, for
    position-pages ``j`` (int64) whose first slots lie in storage pages ``units``."""
    P, C, keys = plan.config.page_size, plan.config.cp_size, []
    for i, row in enumerate(rows):
        pre = int(plan.prefix_lens[i])
        if pre:
            keys.append(physical(row[0:pre:P] // storage_page, np.arange(-(-pre // P), dtype=_I64)))
    if not keys:
        return 0
    uniq = np.unique(np.concatenate(keys))
    return int(np.bincount(uniq % C, minlength=C).max()) * P
