"""What ``cpkv run-dist`` reports: ``DistCommandResult`` (its JSON form and its text summary)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .local_attention import COMM_KINDS
from .records import CaseResult

TOLERANCE = 1e-5
"""Max abs error (float32) of the CP forward against the single-process reference."""


@dataclass(frozen=True)
class DistCommandResult:
    """What ``cpkv run-dist`` reports (plain data; ``to_dict`` is its JSON form).

    Attributes:
        cp_size, page_size, policy, kv_mode, kv_row_width, layers, kv_buffer, attention, cp_strategy: the run.
        pages_per_lane: ``[C]`` pages of each lane.
        index_topk, index_heads: ``nsa`` only (None for dense attention).
        max_abs_err: max |CP hidden - reference hidden| over every token of every forward (float32).
        per_rank_tokens: ``[C]`` extend tokens computed per rank, over all forwards.
        forwards: per forward: request_ids, prefix_lens, extend_lens, cache_hit_tokens, phases,
            head_owners (-1: none), per_rank_tokens, max_abs_err; for ``nsa`` also logits_measured
            (``[C][layers]`` elements each rank materialised per layer), logits_estimated (``[C]``,
            ``mqa_logits_elements``), topk_rows, topk_mismatched, topk_near_tie.
        logits_match: ``nsa``: measured == estimated for every forward, rank and layer (None: dense).
        topk_rows, topk_mismatched, topk_near_tie: ``nsa``: top-k rows (tokens x layers) compared with the
            reference, rows that differ, and of those the rows at a near tie (allowed by C-NSA); None: dense.
        unwritten_rows_intact: every KV row nobody wrote kept its guard bits.
        cache_counters: prefix-cache counters. wall_s: seconds of the run (spawn included).
        kv_access: ``shared`` or ``local`` (SPEC C-MERGE). decode_steps: greedy tokens per request.
        decodes: per decode batch: after_forward, request_ids, prompt_lens, tokens (``[B][N]``),
            reference_tokens, tokens_match, max_abs_err, logits_max_abs_err, per_rank_tokens, token_lanes,
            phases, comm_bytes (per step), and for ``nsa`` logits_measured / logits_estimated (per step),
            topk_rows, topk_mismatched, topk_near_tie. (``max_abs_err`` and the top-k counts above include
            the decode steps.)
        tokens_match: every decoded token equals the reference's greedy choice (None: no decode steps).
        comm_bytes: ``{kind: {"sent": [C], "recv": [C]}}`` bytes per rank over every forward and decode step
            (``queries``, ``partials``, ``topk``; zero under ``shared``); per forward in ``forwards``.
    """

    cp_size: int
    page_size: int
    pages_per_lane: list[int]
    policy: str
    kv_mode: str
    kv_row_width: int
    layers: int
    kv_buffer: str
    attention: str
    index_topk: int | None
    index_heads: int | None
    max_abs_err: float
    per_rank_tokens: list[int]
    forwards: list[dict]
    logits_match: bool | None
    topk_rows: int | None
    topk_mismatched: int | None
    topk_near_tie: int | None
    unwritten_rows_intact: bool
    cache_counters: dict
    wall_s: float
    kv_access: str = "shared"
    decode_steps: int = 0
    decodes: list[dict] = field(default_factory=list)
    tokens_match: bool | None = None
    comm_bytes: dict = field(default_factory=dict)
    cp_strategy: str = "zigzag"

    @property
    def ok(self) -> bool:
        """Within tolerance, no stray KV write, decoded tokens equal the reference's, and for ``nsa``:
        logits counts match and top-k rows agree with the reference except at near ties."""
        nsa_ok = self.attention != "nsa" or (
            bool(self.logits_match) and self.topk_mismatched == self.topk_near_tie
        )
        tokens_ok = self.tokens_match is not False
        return self.max_abs_err <= TOLERANCE and self.unwritten_rows_intact and nsa_ok and tokens_ok

    @classmethod
    def from_case(cls, result: CaseResult, model, wall_s: float) -> DistCommandResult:
        """Summarise rank 0's ``CaseResult`` of a case run with ``model`` (its ``TinyDecoderConfig``)."""
        keys = [
            "request_ids",
            "prefix_lens",
            "extend_lens",
            "cache_hit_tokens",
            "phases",
            "head_owners",
            "per_rank_tokens",
            "max_abs_err",
            "comm_bytes",
        ]
        nsa = model.nsa
        nsa_keys = ["logits_measured", "logits_estimated", "topk_rows", "topk_mismatched", "topk_near_tie"]
        if nsa:
            keys += nsa_keys
        forwards = [{"forward": f.index, **{k: getattr(f, k) for k in keys}} for f in result.forwards]
        dkeys = [
            "after_forward",
            "request_ids",
            "prompt_lens",
            "tokens",
            "reference_tokens",
            "tokens_match",
            "max_abs_err",
            "logits_max_abs_err",
            "per_rank_tokens",
            "token_lanes",
            "phases",
            "comm_bytes",
            *(nsa_keys if nsa else []),
        ]
        decodes = [{k: getattr(d, k) for k in dkeys} for d in result.decodes]
        steps = [f["comm_bytes"] for f in forwards] + [c for d in decodes for c in d["comm_bytes"]]
        rows, mismatched, near = result.topk_counts() if nsa else (None, None, None)
        return cls(
            cp_size=result.cp_size,
            page_size=result.page_size,
            pages_per_lane=result.pages_per_lane,
            policy=result.policy,
            kv_mode=model.kv_mode,
            kv_row_width=model.kv_row_width,
            layers=model.num_layers,
            kv_buffer=result.kv_buffer,
            attention=model.attention,
            index_topk=model.index_topk if nsa else None,
            index_heads=model.index_heads if nsa else None,
            max_abs_err=float(result.max_abs_err or 0.0),
            per_rank_tokens=result.per_rank_tokens,
            forwards=forwards,
            logits_match=result.logits_match,
            topk_rows=rows,
            topk_mismatched=mismatched,
            topk_near_tie=near,
            unwritten_rows_intact=bool(result.unwritten_rows_intact),
            cache_counters=result.cache_counters,
            wall_s=wall_s,
            kv_access=result.kv_access,
            decode_steps=result.decodes[0].steps if result.decodes else 0,
            decodes=decodes,
            tokens_match=result.tokens_match,
            comm_bytes=_sum_comm(steps, result.cp_size),
            cp_strategy=result.cp_strategy,
        )

    def to_dict(self) -> dict:
        """JSON-ready dict of every field plus ``ok`` and ``tolerance``."""
        return {**asdict(self), "ok": self.ok, "tolerance": TOLERANCE}

    def summary(self) -> str:
        """Human-readable report: the run, a line per forward, per-rank tokens, the verdict lines."""
        nsa = self.attention == "nsa"
        logits = [_logits(f["logits_measured"], f["logits_estimated"]) for f in self.forwards] if nsa else []
        width = max([48, *map(len, logits)])
        q = self.pages_per_lane
        lines = [
            f"cpkv run-dist: cp_size={self.cp_size} page_size={self.page_size} "
            f"pages_per_lane={q[0] if len(set(q)) == 1 else _ints(q)} policy={self.policy} "
            f"cp_strategy={self.cp_strategy} kv={self.kv_mode} (row {self.kv_row_width} floats) layers={self.layers} kv_buffer={self.kv_buffer} "
            f"attention={self.attention}"
            + (f" (index_topk={self.index_topk}, index_heads={self.index_heads})" if nsa else "")
            + f" kv_access={self.kv_access}"
            + (f" decode_steps={self.decode_steps}" if self.decode_steps else ""),
            f"{'fwd':>3}  {'prefix_lens':<16} {'extend_lens':<16} {'cache_hit':<16} {'phases':<10} "
            f"{'per_rank_tokens':<20} {'max_abs_err':<11}"
            + (
                f"  {'logits elements per rank: measured vs estimated':<{width}} top-k rows differing"
                if nsa
                else ""
            ),
        ]
        for k, f in enumerate(self.forwards):
            line = (
                f"{f['forward']:>3}  {_ints(f['prefix_lens']):<16} {_ints(f['extend_lens']):<16} "
                f"{_ints(f['cache_hit_tokens']):<16} {_ints(f['phases']):<10} {_ints(f['per_rank_tokens']):<20} "
                f"{f['max_abs_err']:<11.2e}"
            )
            if nsa:
                line += f"  {logits[k]:<{width}} {f['topk_mismatched']}"
            lines.append(line)
        lines += [
            f"per-rank tokens (all forwards): {self.per_rank_tokens}",
            f"prefix-cache hits: {self.cache_counters.get('matched_tokens', 0)} tokens",
        ]
        lines += self._comm_lines() + self._decode_lines()
        if nsa:
            formula = "local_logits_elements" if self.kv_access == "local" else "mqa_logits_elements"
            lines += [
                f"MQA-logits elements: measured == estimated ({formula}) for every rank and layer of "
                f"all {len(self.forwards)} forwards" + (" and decode steps" if self.decodes else "")
                if self.logits_match
                else "MQA-logits elements: measured != estimated in some forward (see the lines above) FAIL",
                f"top-k mismatched rows vs single-process reference: {self.topk_mismatched} of {self.topk_rows} "
                f"(tokens x layers; {self.topk_near_tie} at near ties, allowed)"
                + ("" if self.topk_mismatched == self.topk_near_tie else " FAIL"),
            ]
        verdict = "OK" if self.ok else "FAIL"
        lines += [
            f"max abs error vs single-process reference: {self.max_abs_err:.3e} (tolerance {TOLERANCE:g}) {verdict}"
            + ("" if self.unwritten_rows_intact else "; a KV row outside the written slots changed"),
            f"wall time: {self.wall_s:.1f} s",
        ]
        return "\n".join(lines)

    def _comm_lines(self) -> list[str]:
        """Bytes each rank sent per forward and decode step, by kind (``local``); one line under ``shared``."""
        if self.kv_access != "local":
            return ["communication: no query, partial or top-k exchange (kv_access=shared reads the view)"]
        kinds = [k for k in COMM_KINDS if k != "topk" or self.attention == "nsa"]
        out = [
            f"communication, bytes sent per rank over all {self.layers} layers (each layer 1/{self.layers} of it; "
            f"{' | '.join(kinds)}; received: see --json), per forward and decode step (dec F.J: step J of "
            f"the decode after forward F):"
        ]
        rows = [(f"fwd {f['forward']}", f["comm_bytes"]) for f in self.forwards]
        for d in self.decodes:  # runs of decode steps that exchanged the same bytes share a line
            steps, j0 = d["comm_bytes"], 0
            for j in range(1, len(steps) + 1):
                if j == len(steps) or steps[j] != steps[j0]:
                    rows.append(
                        (f"dec {d['after_forward']}.{j0}" + (f"-{j - 1}" if j - 1 > j0 else ""), steps[j0])
                    )
                    j0 = j
        rows.append(("total", self.comm_bytes))
        for name, c in rows:
            out.append(f"  {name:<10} " + " | ".join(_ints(c[k]["sent"]) for k in kinds))
        return out

    def _decode_lines(self) -> list[str]:
        """One block per decode batch: requests, generated tokens, their agreement with the reference."""
        out = []
        for d in self.decodes:
            same = "identical to" if d["tokens_match"] else "DIFFERENT from"
            out.append(
                f"decode after forward {d['after_forward']}: requests {_ints(d['request_ids'])}, "
                f"{len(d['tokens'][0])} steps, per-rank tokens {_ints(d['per_rank_tokens'])}, max abs error "
                f"{d['max_abs_err']:.2e} (logits {d['logits_max_abs_err']:.2e}), tokens {same} the reference"
                + (f", top-k rows differing {d['topk_mismatched']}" if "topk_mismatched" in d else "")
            )
            for rid, toks, lanes in zip(d["request_ids"], d["tokens"], d["token_lanes"], strict=True):
                out.append(f"  request {rid}: tokens {_ints(toks)} on lanes {_ints(lanes)}")
        if self.decodes:
            n = sum(len(t) * len(t[0]) for t in (d["tokens"] for d in self.decodes))
            out.append(
                f"decoded tokens vs single-process greedy reference: {n} tokens, "
                + ("all identical" if self.tokens_match else "some differ FAIL")
            )
        return out


def _sum_comm(steps: list[dict], cp_size: int) -> dict:
    """Per kind and direction, the per-rank sum of the steps' ``comm_bytes`` dicts."""
    total = {k: {"sent": [0] * cp_size, "recv": [0] * cp_size} for k in COMM_KINDS}
    for c in steps:
        for k in COMM_KINDS:
            for d in ("sent", "recv"):
                total[k][d] = [a + b for a, b in zip(total[k][d], c[k][d], strict=True)]
    return total


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(int(v)) for v in values) if values else "-"


def _logits(measured: list[list[int]], estimated: list[int]) -> str:
    """``measured == estimated`` per rank (a rank whose layers differ shows its per-layer counts)."""
    per_rank = [str(row[0]) if len(set(row)) == 1 else "/".join(map(str, row)) for row in measured]
    same = all(m == e for row, e in zip(measured, estimated, strict=True) for m in row)
    return f"{','.join(per_rank)} {'==' if same else '!='} {_ints(estimated)}"
