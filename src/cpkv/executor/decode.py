"""Greedy decode on owner lanes after a CP prefill (SPEC C-MERGE "Decode", C-OWNER-EQ-COMPUTE).

The requests whose prompts are done at the end of a wave (``Workload.decode_after``) are decoded together,
``steps`` tokens each. Step j:

1. every rank takes the greedy token of each request from the gathered final hidden state of its last
   position (``TinyDecoder.next_tokens``, the seeded LM head): the same tokens on every rank, bit for bit;
2. the replicated scheduler gives each request one slot with ``alloc_decode`` (the policy places a new
   page when the position starts one; otherwise the token continues the last page, on that page's lane);
3. ``CPExecutor.forward`` runs the one-token-per-request batch: the owner of the token's page computes it
   and writes its KV into its own lane; its attention reads every earlier position through the view
   (``shared``) or merges every rank's partial over its own pages (``local``).

Rank 0 then runs the single-process reference over each whole sequence (prompt and generated tokens, no
cache) and compares the hidden states, the LM-head logits, each generated token with the reference's
greedy choice and, for ``nsa``, the top-k rows (``record_decode``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .forward import CPExecutor, WriteAudit
from .group import RankGroup
from .model import TinyDecoder
from .records import comm_dict, logits_estimate
from .scheduler import ReplicatedScheduler


@dataclass(frozen=True, eq=False)
class DecodeRecord:
    """One decode batch (the requests held when forward ``after_forward`` ended), one rank.

    Attributes:
        after_forward: the prefill forward after which it ran. request_ids, prompt_lens: ``[B]``.
        steps: decode steps N (one token per request each). first_index: batch index of the first step.
        tokens: ``[B][N]`` generated tokens, the token fed at each step (greedy from the previous hidden).
        token_lanes: ``[B][N]`` lane of each decode token's page, i.e. the rank that computed it.
        per_rank_tokens: ``[C]`` decode tokens each rank computed over the steps.
        phases: ``[N][B]`` owner phase of each step's plan.
        page_lanes: ``[B]`` lists, the lane of each page of each request after the last step.
        comm_bytes: per step ``{kind: {"sent": [C], "recv": [C]}}`` (``records.comm_dict``).
        logits_measured, logits_estimated: ``nsa``: per step ``[C][layers]`` and ``[C]`` (else None).
        reference_tokens: rank 0: ``[B][N]`` the reference's greedy choice at each step.
        max_abs_err: rank 0: max |hidden - reference| over the decode positions.
        logits_max_abs_err: rank 0: max |LM-head logits - reference| over the last prompt position and every
            decode position.
        topk_rows, topk_mismatched, topk_near_tie: ``nsa``, rank 0: as ``ForwardRecord``, over the steps.
        hidden: rank 0: ``[N, B, hidden]`` float32 gathered hidden states of the decode tokens.
        topk: ``nsa``, rank 0: ``[N, B, layers, index_topk]`` selected positions.
    """

    after_forward: int
    request_ids: list[int]
    prompt_lens: list[int]
    steps: int
    first_index: int
    tokens: list[list[int]]
    token_lanes: list[list[int]]
    per_rank_tokens: list[int]
    phases: list[list[int]]
    page_lanes: list[list[int]]
    comm_bytes: list[dict]
    logits_measured: list[list[list[int]]] | None = None
    logits_estimated: list[list[int]] | None = None
    reference_tokens: list[list[int]] | None = None
    max_abs_err: float | None = None
    logits_max_abs_err: float | None = None
    topk_rows: int | None = None
    topk_mismatched: int | None = None
    topk_near_tie: int | None = None
    hidden: np.ndarray | None = None
    topk: np.ndarray | None = None

    @property
    def tokens_match(self) -> bool | None:
        """Rank 0: every generated token equals the reference's greedy choice (None elsewhere)."""
        return None if self.reference_tokens is None else self.tokens == self.reference_tokens

    @property
    def logits_match(self) -> bool | None:
        """``nsa``: measured == estimated logits elements on every step, rank and layer (None: dense)."""
        if self.logits_measured is None or self.logits_estimated is None:
            return None
        return all(
            m == e
            for step, est in zip(self.logits_measured, self.logits_estimated, strict=True)
            for row, e in zip(step, est, strict=True)
            for m in row
        )


def run_decode(
    group: RankGroup,
    sched: ReplicatedScheduler,
    executor: CPExecutor,
    model: TinyDecoder,
    request_ids: list[int],
    last_hidden: torch.Tensor,
    after_forward: int,
    steps: int,
    first_index: int,
    *,
    local: bool,
    check_replicas: bool,
):
    """Decode held requests ``request_ids`` for ``steps`` steps (collective).

    Args:
        group, sched, executor, model: the case's.
        request_ids: held requests (prompts done), in the order they finished.
        last_hidden: ``[B, hidden]`` gathered final hidden state of each request's last prompt position
            (the same on every rank): it gives the first token.
        after_forward: the workload forward after which they are decoded. steps: N >= 1. first_index: batch
            index of the first step (after the workload's forwards). local: ``kv_access == "local"`` (which
            logits formula applies). check_replicas: all-gather the scheduler digest after every step.

    Returns:
        ``(DecodeRecord, [N] out_cache_loc of every step, the steps' WriteAudit list)``; on rank 0 the
        record holds the comparison with the reference (``record_decode``).
    """
    h = last_hidden
    comm: list[dict] = []
    audits: list[WriteAudit] = []
    tokens, lanes, phases, measured, estimated, hidden, topk, locs = ([] for _ in range(8))
    C, P = group.world_size, sched.config.page_size
    per_rank = np.zeros(C, dtype=np.int64)
    for j in range(steps):
        index = first_index + j
        step = group.run(
            f"decode {index}: greedy tokens + schedule",
            lambda h=h, index=index: sched.schedule_decode(
                index, request_ids, model.next_tokens(h).cpu().tolist()
            ),
        )
        step_tokens = step.token_ids.cpu().tolist()
        if check_replicas:
            group.check_replicas(sched.digest(), f"decode {index}: schedule")
        res = executor.forward(step)
        h = res.hidden
        plan = step.alloc.plan
        tokens.append(step_tokens)
        lanes.append(plan.token_owner.tolist())
        phases.append(plan.request_phases.tolist())
        per_rank += plan.per_rank_tokens
        step_comm = comm_dict(res.comm_bytes)
        assert step_comm is not None  # CPExecutor.forward counts every step's bytes
        comm.append(step_comm)
        locs.append(step.out_cache_loc.cpu())
        audits.extend(res.audits)
        if res.logits_elements is not None:
            measured.append(res.logits_elements.tolist())
            estimated.append(logits_estimate(step, local).tolist())
        hidden.append(h.cpu())
        if res.topk is not None:
            topk.append(res.topk.cpu())
    record = DecodeRecord(
        after_forward=after_forward,
        request_ids=list(request_ids),
        prompt_lens=[len(sched.workload.requests[r]) for r in request_ids],
        steps=steps,
        first_index=first_index,
        tokens=[list(t) for t in zip(*tokens, strict=True)],
        token_lanes=[list(t) for t in zip(*lanes, strict=True)],
        per_rank_tokens=per_rank.tolist(),
        phases=phases,
        comm_bytes=comm,
        page_lanes=[((sched.req_to_token[r][::P] // P) % C).tolist() for r in request_ids],
        logits_measured=measured or None,
        logits_estimated=estimated or None,
        hidden=torch.stack(hidden).numpy() if group.rank == 0 else None,
        topk=torch.stack(topk).numpy() if topk and group.rank == 0 else None,
    )
    if group.rank == 0:
        record = group.run(
            f"decode {first_index}: record", record_decode, record, sched, model, last_hidden.cpu().numpy()
        )
    else:
        group.barrier_ok(f"decode {first_index}: record")
    return record, locs, audits


def record_decode(
    record: DecodeRecord, sched: ReplicatedScheduler, model: TinyDecoder, last_hidden: np.ndarray
) -> DecodeRecord:
    """Rank 0: ``record`` compared with the single-process reference of every whole sequence.

    Args:
        record: from ``run_decode``. sched: the case's scheduler (prompts, generated tokens).
        model: the decoder. last_hidden: ``[B, hidden]`` the CP hidden states of the last prompt positions.
    """
    N = record.steps
    ref_tokens, err, lerr = [], 0.0, 0.0
    rows, mismatched, near, topk = 0, 0, 0, record.topk
    for i, rid in enumerate(record.request_ids):
        L = record.prompt_lens[i]
        ids = torch.tensor(list(sched.workload.requests[rid]) + record.tokens[i], device=model.device)
        ref = model.reference(ids)
        ref_h = ref.hidden.cpu()
        cp_h = torch.from_numpy(record.hidden[:, i])  # type: ignore[index]  # [N, hidden], positions L .. L+N-1
        err = max(err, float((cp_h - ref_h[L : L + N]).abs().max()))
        ref_logits = model.lm_logits(ref_h[L - 1 : L + N].to(model.device)).cpu()
        cp_logits = model.lm_logits(
            torch.cat([torch.from_numpy(last_hidden[i : i + 1]), cp_h]).to(model.device)
        )
        lerr = max(lerr, float((cp_logits.cpu() - ref_logits).abs().max()))
        ref_tokens.append(torch.argmax(ref_logits[:N], dim=-1).tolist())
        if topk is not None:
            differs = torch.from_numpy(topk[:, i] != ref.topk.cpu()[L : L + N].numpy()).any(-1)  # type: ignore[union-attr]
            tied = ref.near_tie.cpu()[L : L + N]  # type: ignore[union-attr]
            rows, mismatched = rows + differs.numel(), mismatched + int(differs.sum())
            near += int((differs & tied).sum())
    extra = dict(topk_rows=rows, topk_mismatched=mismatched, topk_near_tie=near) if topk is not None else {}
    return DecodeRecord(
        **{
            **record.__dict__,
            "reference_tokens": ref_tokens,
            "max_abs_err": err,
            "logits_max_abs_err": lerr,
            **extra,
        }
    )
