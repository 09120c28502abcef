"""Simulator configuration: one CP prefill group, its KV pool, scheduler and cost model."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..config import (
    CP_STRATEGIES,
    DEFAULT_PAGE_SIZE,
    INT64_MAX,
    ZIGZAG,
    check_cp_size,
    check_int,
    per_lane_ints,
)
from ..cost.spec import MeasuredSpec
from ..errors import ConfigError
from ..validate import check_name
from .workload import WorkloadSpec


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Step-time model of one CP prefill step (documented in ``docs/metrics.md``).

    A rank's work in a step is ``linear_ms_per_token * tokens_r + attn_ms_per_pair * pairs_r`` where
    ``pairs_r`` counts the causal (query, key) pairs of the rank's queries, prefix keys included. A step
    lasts ``step_overhead_ms + max_r work_r``: the slowest rank sets the pace, so compute imbalance
    shows in time to first token. Decode tokens (``--colocated-decode``) add linear work on their rank.

    Attributes:
        linear_ms_per_token: ms per token for the dense part (projections, MLP), per rank.
        attn_ms_per_pair: ms per causal (query, key) pair, per rank.
        step_overhead_ms: fixed ms per step (launch, collectives), not part of ``work_r``.
    """

    linear_ms_per_token: float = 0.1
    attn_ms_per_pair: float = 2e-6
    step_overhead_ms: float = 2.0


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Configuration of one simulated CP prefill group.

    Attributes:
        cp_size: ranks (C), at most ``cpkv.limits.MAX_CP_SIZE``. page_size: tokens per page (P).
        pages_per_lane: device pages per lane (Q), page 0 reserved: one int for every lane, or a tuple of
            C ints when ranks have unequal free memory (e.g. ``(9, 10, 10, 10)``; a list is turned into a
            tuple). Each >= 2.
        host_pages_per_lane: host-tier pages per lane for evicted prefixes (0: no host tier).
        chunk_size: most prefill tokens one request advances in one step (chunked prefill), tokens.
        max_batch_tokens: most prefill tokens of one step over all requests, tokens.
        max_running: most requests admitted (holding pages) at once.
        logits_budget_mb: MQA-logits buffer budget per rank, MiB (float32 elements, C-ESTIMATE);
            0 disables the check.
        colocated_decode: keep pages after prefill for ``output_length`` decode steps (``alloc_decode``);
            default False (prefill instance of a P/D-disaggregated deployment: pages go to the cache).
        spec_draft_tokens: K, KV slots per request of one MTP speculative decode step (root + K-1 drafts;
            ``alloc_draft``, verify, ``release_tail``; see ``sim/spec_decode.py``); 0 (default) is plain
            decode. K >= 1 implies ``colocated_decode`` (set True here).
        spec_accept_rate: A in [0, 1], probability that a draft token is accepted when the drafts before it
            were (seeded per request from ``seed``); default 0.7.
        livelock_steps: consecutive steps without progress while work is pending that stop a run.
        seed: seed recorded in the report (workload generators take it).
        ttft_slo_ms: TTFT service-level objective, ms, or None (default): with one, the report's
            ``slo_attainment`` is the share of all requests whose TTFT is at most it (docs/metrics.md).
        cost: the ``CostModel`` (the illustrative constants).
        measured: the measurements that price steps (``cpkv.cost.MeasuredSpec``: GPU, model, engine, EP
            width), or None (the library default) for the illustrative ``cost``; SPEC C-COST.
        cp_strategy: how each request's new pages go to the ranks that own and compute them (C-INTERLEAVE):
            ``zigzag`` (default, C-ZIGZAG) or ``interleave`` (new page k on lane ``(phase + k) % C``); every
            KV storage design computes with it. Never read from ``CPKV_CP_STRATEGY``: a replay is what its
            config says.

    Raises:
        ConfigError: a size below its minimum; ``page_size``, ``host_pages_per_lane``, ``spec_draft_tokens``
            or ``pages_per_lane`` above the int64 range (the budgets and the seed size no array and are not
            bounded); ``cp_size`` above ``cpkv.limits.MAX_CP_SIZE``; an unknown ``cp_strategy`` (named).
    """

    cp_size: int = 8
    page_size: int = DEFAULT_PAGE_SIZE
    pages_per_lane: int | tuple[int, ...] = 16384
    host_pages_per_lane: int = 0
    chunk_size: int = 8192
    max_batch_tokens: int = 16384
    max_running: int = 256
    logits_budget_mb: float = 0.0
    colocated_decode: bool = False
    spec_draft_tokens: int = 0
    spec_accept_rate: float = 0.7
    livelock_steps: int = 64
    seed: int = 0
    ttft_slo_ms: float | None = None
    cost: CostModel = field(default_factory=CostModel)
    measured: MeasuredSpec | None = None
    cp_strategy: str = ZIGZAG

    def __post_init__(self) -> None:
        object.__setattr__(self, "cp_size", check_cp_size(self.cp_size))
        check_name(self.cp_strategy, CP_STRATEGIES, "cp_strategy")
        for (
            name,
            minimum,
            maximum,
        ) in (  # sizes of arrays stay in int64; budgets, counts and the seed size none
            ("page_size", 1, INT64_MAX),
            ("host_pages_per_lane", 0, INT64_MAX),
            ("spec_draft_tokens", 0, INT64_MAX),
            ("chunk_size", 1, None),
            ("max_batch_tokens", 1, None),
            ("max_running", 1, None),
            ("livelock_steps", 1, None),
            ("seed", 0, None),
        ):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum, maximum))
        caps = per_lane_ints("pages_per_lane", self.pages_per_lane, self.cp_size, 2)
        uniform = hasattr(self.pages_per_lane, "__index__") and not isinstance(self.pages_per_lane, bool)
        object.__setattr__(self, "pages_per_lane", caps[0] if uniform else tuple(caps))
        if not 0 <= self.logits_budget_mb < float("inf"):
            raise ConfigError(f"logits_budget_mb must be a finite number >= 0, got {self.logits_budget_mb!r}")
        slo = self.ttft_slo_ms
        if slo is not None and (
            isinstance(slo, bool) or not isinstance(slo, (int, float)) or not 0 < slo < float("inf")
        ):
            raise ConfigError(f"ttft_slo_ms must be a finite number of ms > 0 or None, got {slo!r}")
        rate = self.spec_accept_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise ConfigError(f"spec_accept_rate must be a number in [0, 1], got {rate!r}")
        if self.spec_draft_tokens:
            object.__setattr__(self, "colocated_decode", True)  # speculative decoding is a decode mode
        if self.measured is not None:
            if not isinstance(self.measured, MeasuredSpec):
                raise ConfigError(f"measured must be a cpkv.cost.MeasuredSpec or None, got {self.measured!r}")
            self.measured.ep_for(self.cp_size)  # CostModelError (a ConfigError's sibling) unless it divides

    @property
    def lane_capacities(self) -> tuple[int, ...]:
        """Pages of each lane (page 0 included), ``C`` ints: ``pages_per_lane`` spread over the lanes."""
        return tuple(per_lane_ints("pages_per_lane", self.pages_per_lane, self.cp_size, 2))

    @property
    def logits_budget_elements(self) -> int | None:
        """The MQA-logits budget per rank in float32 elements, or None when disabled."""
        return int(self.logits_budget_mb * 2**20 // 4) if self.logits_budget_mb else None

    @classmethod
    def for_workload(cls, spec: WorkloadSpec, **settings) -> SimConfig:
        """The config for ``spec``: ``settings`` (SimConfig fields) given as None take the workload's value.

        ``chunk_size``: the workload's ``chunk_pages * page_size`` if it has one, else the default 8192.
        ``max_batch_tokens``: ``max(2 * chunk_size, 16384)``. ``pages_per_lane``: under the measured cost
        model (``measured`` given) what one GPU holds (``memory_of``: SGLang's KV pool at the group's layout,
        aiconfigurator's estimator; where the model leaves no pool, the default, hypothetical); else the
        default 16384; a workload with ``pool_percent`` (either model) whose pool (all lanes) is that percentage of its prompt pages,
        ``ceil(pages * pool_percent / (100 * C))`` per lane: e.g. tiny-chunks at 125 % (the burst needs
        80 % of the pool; rotation fits it, while a phase-0 planner that piles every page on lane 0 runs
        out of lane 0 long before any request finishes). ``host_pages_per_lane``: 0, except a workload with
        ``host_percent``: ``ceil(pages * host_percent / 100)`` per lane. Raises ConfigError as the
        constructor.
        """
        given = {k: v for k, v in settings.items() if v is not None}
        P = check_int("page_size", given.get("page_size", cls.page_size), 1)
        C = check_cp_size(given.get("cp_size", cls.cp_size))
        if "chunk_size" not in given and spec.chunk_pages:
            given["chunk_size"] = spec.chunk_pages * P
        given.setdefault(
            "max_batch_tokens", max(2 * given.get("chunk_size", cls.chunk_size), cls.max_batch_tokens)
        )
        pages = spec.prompt_pages(P) if spec.pool_percent or spec.host_percent else 0
        if "pages_per_lane" not in given and spec.pool_percent:
            given["pages_per_lane"] = max(2, -(-pages * spec.pool_percent // (100 * C)))
        measured = given.get("measured")
        if "pages_per_lane" not in given and measured is not None:  # what the GPU holds (cost.memory)
            held = memory_of(
                measured,
                C,
                P,
                given.get("chunk_size", cls.chunk_size),
                given["max_batch_tokens"],
                given.get("max_running", cls.max_running),
            )["pages_per_lane"]
            given["pages_per_lane"] = held if held >= 2 else cls.pages_per_lane  # no fit: hypothetical, said
        if "host_pages_per_lane" not in given and spec.host_percent:
            given["host_pages_per_lane"] = -(-pages * spec.host_percent // 100)
        return cls(**given)

    def memory(self) -> dict | None:
        """The memory of one GPU under ``measured`` (``memory_of``), or None under the illustrative model."""
        if self.measured is None:
            return None
        return memory_of(
            self.measured,
            self.cp_size,
            self.page_size,
            self.chunk_size,
            self.max_batch_tokens,
            self.max_running,
        )

    def to_dict(self) -> dict:
        """Plain dict for ``report.json``."""
        return asdict(self)


def memory_of(
    measured: MeasuredSpec,
    cp_size: int,
    page_size: int,
    chunk_size: int,
    max_batch_tokens: int,
    max_running: int,
) -> dict:
    """One GPU's memory and the pool it leaves (``cpkv.cost.memory.memory_plan``; aiconfigurator's KV-cache
    estimator). Raises CostModelError (the model does not fit), CostExtraMissing."""
    from ..cost.memory import memory_plan

    return memory_plan(measured, cp_size, chunk_size, max_batch_tokens, max_running, page_size)


OWNER_LANE = "owner-lane"
KV_STORAGE_DESIGNS = (OWNER_LANE, "replicated", "interleaved", "interleaved-vblock")
"""KV storage designs of a CP group (SPEC C-STORAGE; ``sim.storage`` builds them): ``owner-lane`` (cpkv, the
default), ``replicated`` (SGLang in-seq-split CP up to 0.5.9), ``interleaved`` (SGLang 0.5.23 page
interleave), ``interleaved-vblock`` (vLLM DCP virtual blocks)."""
