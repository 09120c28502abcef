"""Every step priced from measured operator latencies of one GPU, model and engine (SPEC C-COST).

Rank ``r`` of a prefill step works

    linear_r    = per_token(n_r) + group(T) + logits(B)
    attention_r = F [n_r > 0] + sum over r's runs [a, b) of (attention(b - a, a) - F)
    comm_r      = dispatch(C * M) + allgather(M rows of hidden states)      (gather-back, C-GATHER)

with ``n_r`` its tokens, ``T`` the step's tokens, ``B`` its requests, ``M = max_r n_r`` and
``F = attention(1, 0)``; decode tokens are priced from the generation tables on the rank that owns their
page. The composition (aiconfigurator's, ``aic.py``, less the per-layer KV all-gather owner lanes remove)
and what is not priced: docs/cost-model.md, "What a step costs".
"""

from __future__ import annotations

import numpy as np

from ..planner import BatchPlan
from .comm import CommCost
from .spec import MeasuredSpec
from .step_cost import causal_pairs_per_rank
from .tables import PriceTables

BREAKDOWN = ("linear", "attention", "indexer", "comm")
HIDDEN_BYTES = 2
"""Bytes of one hidden-state element in the gather-back (bf16)."""


def _tokens(plan: BatchPlan | None) -> BatchPlan | None:
    """``plan``, or None when it computes no token."""
    return plan if plan is not None and plan.num_tokens else None


class MeasuredCost:
    """The measured cost model of one CP group of ``cp_size`` GPUs (SPEC C-COST; implements ``StepCost``).

    Build it with ``MeasuredCost.load(spec, cp_size)`` (needs the ``cost`` extra), or from tables.

    Args:
        tables: the group's ``PriceTables`` (``cpkv.cost.aic.price_tables``).
    """

    overhead_ms = 0.0
    """Every measured operator is in some rank's work; aiconfigurator's tables hold no other step time."""

    def __init__(self, tables: PriceTables) -> None:
        self.tables = tables
        self.cp_size = tables.cp_size
        self._fixed = float(tables.attention([1], [0])[0])
        self._gather: dict[int, float] = {}

    @classmethod
    def load(cls, spec: MeasuredSpec, cp_size: int) -> MeasuredCost:
        """The model of ``spec`` for a group of ``cp_size`` GPUs (tables sampled once per process).

        Raises:
            CostExtraMissing: aiconfigurator is not installed (``pip install '.[cost]'`` in a cpkv checkout).
            CostModelError: aiconfigurator cannot price ``spec`` at this ``cp_size``.
        """
        from .aic import price_tables

        return cls(price_tables(spec, cp_size))

    @property
    def comm(self) -> CommCost:
        """The system's collective prices (``allgather_ms``, ``remote_read_ms``, ...)."""
        return self.tables.comm

    def provenance(self) -> dict:
        """Cost model, GPU, model, engine, their versions and a digest of the tables (report.json)."""
        return dict(self.tables.provenance)

    # ------------------------------------------------------------------------------------------ parts
    def gather_back_ms(self, rows: int) -> float:
        """All-gather of ``rows`` hidden-state rows per rank (``C * rows`` in all, C-GATHER), ms."""
        v = self._gather.get(rows)
        if v is None:
            nbytes = rows * self.tables.hidden_size * HIDDEN_BYTES
            v = self._gather[rows] = self.comm.allgather_ms(nbytes, self.cp_size)
        return v

    def kv_allgather_ms(self, rows_per_rank) -> float:
        """Per-layer all-gathers of ``rows_per_rank`` KV rows per rank (``tables.kv_gather_row_bytes`` each:
        latent and index key in bf16, as SGLang gathers them), summed over the model's layers, ms: what a
        replicated or interleaved KV pool pays per prefill step (C-STORAGE), and owner lanes do not."""
        t = self.tables
        rows = np.asarray(rows_per_rank, dtype=np.float64)
        return t.num_layers * self.comm.allgather_ms(rows * t.kv_gather_row_bytes, self.cp_size)

    def _attention(self, plan: BatchPlan) -> np.ndarray:
        """Per rank: the attention module's ms over its runs."""
        owner, a, b = plan.position_runs()
        runs = self.tables.attention(b - a, a)
        runs -= self._fixed
        return np.bincount(owner, weights=runs, minlength=self.cp_size) + self._fixed * (
            plan.per_rank_tokens > 0
        )

    def _indexer_elements(self, plan: BatchPlan | None) -> np.ndarray:
        """Per rank: MQA-logits elements ``(b - a) * b`` of its runs past top-k keys (below, the module
        attends densely and runs no indexer), float64 ``[C]``."""
        if plan is None:
            return np.zeros(self.cp_size)
        owner, a, b = plan.position_runs()
        logits = np.where(b > self.tables.index_topk, (b - a) * b, 0).astype(np.float64)
        return np.bincount(owner, weights=logits, minlength=self.cp_size)

    def _decode_attention(self, decode: BatchPlan) -> np.ndarray:
        d = decode.per_rank_tokens
        mean_len = causal_pairs_per_rank(decode) / np.maximum(d, 1)  # pairs: the tokens' context lengths
        return np.where(d > 0, self.tables.gen_attention(d, mean_len), 0.0)

    def _parts(self, prefill: BatchPlan | None, decode: BatchPlan | None):
        """``(linear, attention, comm)`` per rank, float64 ``[C]`` ms; ``prefill`` / ``decode`` without
        tokens must be None."""
        t, C = self.tables, self.cp_size
        if prefill is None and decode is None:
            zero = np.zeros(C)
            return zero, zero, zero
        attention = self._attention(prefill) if prefill is not None else np.zeros(C)
        if decode is not None:
            attention += self._decode_attention(decode)
        if prefill is None:  # decode only: the generation tables
            assert decode is not None  # both None returned above
            d = decode.per_rank_tokens
            D = decode.num_tokens
            linear = t.gen_per_token(d) + (t.gen_group.at(D) + t.gen_logits.at(D))
            return linear, attention, np.full(C, self.gather_back_ms(int(d.max())))
        n = prefill.per_rank_tokens
        T, B = prefill.num_tokens, int(np.count_nonzero(prefill.extend_lens))
        if decode is not None:
            n = n + decode.per_rank_tokens
            T, B = T + decode.num_tokens, B + decode.num_tokens
        M = int(n.max())
        linear = t.per_token(n) + (t.group.at(T) + t.logits.at(B))
        return linear, attention, np.full(C, t.dispatch.at(C * M) + self.gather_back_ms(M))

    # ------------------------------------------------------------------------------------- interface
    def step_work(self, prefill: BatchPlan | None, decode: BatchPlan | None = None) -> np.ndarray:
        """Work of each rank in one step, float64 ``[C]`` ms (see the module docstring for the terms).

        Args:
            prefill: the step's prefill ``BatchPlan`` (its ``cp_size`` the model's), or None.
            decode: the step's decode ``BatchPlan`` (plain decode or MTP verify), or None.
        """
        linear, attention, comm = self._parts(_tokens(prefill), _tokens(decode))
        linear += attention
        linear += comm
        return linear

    def breakdown(self, prefill: BatchPlan | None, decode: BatchPlan | None = None) -> dict[str, np.ndarray]:
        """``step_work`` split per rank into ``BREAKDOWN``: ``linear`` (embedding, norms, MoE block, LM head),
        ``attention`` (the DSA module less its indexer), ``indexer`` and ``comm``, float64 ``[C]`` ms each,
        summing to ``step_work``. The indexer's part is the module's measured cost per MQA-logits element
        at long contexts times the rank's elements (``(b - a) * b`` per run past top-k keys, C-ESTIMATE),
        at most the rank's attention time: a split for reading, the total is measured."""
        prefill, decode = _tokens(prefill), _tokens(decode)
        linear, attention, comm = self._parts(prefill, decode)
        indexer = np.minimum(self._indexer_elements(prefill) * self.tables.indexer_ms_per_element, attention)
        return {"linear": linear, "attention": attention - indexer, "indexer": indexer, "comm": comm}
