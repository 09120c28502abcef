"""What ``cpkv run-dist`` reports: ``DistCommandResult`` (its JSON form and its text summary)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .records import CaseResult

TOLERANCE = 1e-5
"""Max abs error (float32) of the CP forward against the single-process reference."""


@dataclass(frozen=True)
class DistCommandResult:
    """What ``cpkv run-dist`` reports (plain data; ``to_dict`` is its JSON form).

    Attributes:
        cp_size, page_size, policy, kv_mode, kv_row_width, layers, kv_storage, attention: the run.
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
    """

    cp_size: int
    page_size: int
    pages_per_lane: list[int]
    policy: str
    kv_mode: str
    kv_row_width: int
    layers: int
    kv_storage: str
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

    @property
    def ok(self) -> bool:
        """Within tolerance, no stray KV write, and for ``nsa``: logits counts match and top-k rows agree
        with the reference except at near ties."""
        nsa_ok = self.attention != "nsa" or (
            bool(self.logits_match) and self.topk_mismatched == self.topk_near_tie
        )
        return self.max_abs_err <= TOLERANCE and self.unwritten_rows_intact and nsa_ok

    @classmethod
    def from_case(cls, result: CaseResult, model, wall_s: float) -> DistCommandResult:
        """Summarise rank 0's ``CaseResult`` of a case run with ``model`` (its ``TinyDecoderConfig``)."""
        keys = ["request_ids", "prefix_lens", "extend_lens", "cache_hit_tokens", "phases", "head_owners",
                "per_rank_tokens", "max_abs_err"]  # fmt: skip
        nsa = model.nsa
        if nsa:
            keys += ["logits_measured", "logits_estimated", "topk_rows", "topk_mismatched", "topk_near_tie"]
        forwards = [{"forward": f.index, **{k: getattr(f, k) for k in keys}} for f in result.forwards]
        rows, mismatched, near = result.topk_counts() if nsa else (None, None, None)
        return cls(
            cp_size=result.cp_size, page_size=result.page_size, pages_per_lane=result.pages_per_lane,
            policy=result.policy, kv_mode=model.kv_mode, kv_row_width=model.kv_row_width,
            layers=model.num_layers, kv_storage=result.kv_storage, attention=model.attention,
            index_topk=model.index_topk if nsa else None, index_heads=model.index_heads if nsa else None,
            max_abs_err=float(result.max_abs_err or 0.0), per_rank_tokens=result.per_rank_tokens,
            forwards=forwards, logits_match=result.logits_match, topk_rows=rows, topk_mismatched=mismatched,
            topk_near_tie=near, unwritten_rows_intact=bool(result.unwritten_rows_intact),
            cache_counters=result.cache_counters, wall_s=wall_s,
        )  # fmt: skip

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
            f"kv={self.kv_mode} (row {self.kv_row_width} floats) layers={self.layers} storage={self.kv_storage} "
            f"attention={self.attention}"
            + (f" (index_topk={self.index_topk}, index_heads={self.index_heads})" if nsa else ""),
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
        if nsa:
            lines += [
                "MQA-logits elements: measured == estimated (mqa_logits_elements) for every rank and layer of "
                f"all {len(self.forwards)} forwards"
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


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(int(v)) for v in values) if values else "-"


def _logits(measured: list[list[int]], estimated: list[int]) -> str:
    """``measured == estimated`` per rank (a rank whose layers differ shows its per-layer counts)."""
    per_rank = [str(row[0]) if len(set(row)) == 1 else "/".join(map(str, row)) for row in measured]
    same = all(m == e for row, e in zip(measured, estimated, strict=True) for m in row)
    return f"{','.join(per_rank)} {'==' if same else '!='} {_ints(estimated)}"
