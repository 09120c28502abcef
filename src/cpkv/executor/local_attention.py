"""One rank's attention under ``kv_access = local``: pass-Q and the exact cross-rank merge (SPEC C-MERGE).

A rank holds only its own lane of every pool. For one layer of a forward (a prefill chunk or a decode
step, the same code), after each rank has written its own tokens' rows into its own lane:

1. **queries** (pass-Q): each rank computes the queries of the tokens it owns and they are all-gathered,
   so every rank has every query of the batch (dense: the attention queries; ``nsa``: also the index
   queries ``q_I`` and gate weights ``w``);
2. **partials**: every rank attends every query over the keys it holds and the query may see;
   - dense: all its causal keys of the request;
   - ``nsa``: per run ``[a, b)`` of positions (any rank's), the index logits against its own index keys
     at positions ``< b`` (a ``(b - a) x |own keys < b|`` block, counted), its local top-k candidates
     ``(logit, position)``; the candidates are all-gathered and every rank takes the same global top-k
     (``merge.merge_topk``); then sparse MLA over the selected positions it holds;
3. **merge**: the partials ``(O_r, LSE_r)`` go to each query's owner (all-to-all, exact sizes), which
   merges them (``merge.merge_partials``), applies the output projections and runs the MLP.

Every compute step ends in ``RankGroup.run`` (error agreement) before the next collective, so a failing
rank never leaves its peers blocked. The bytes each rank sends and receives in each exchange are counted
on the tensors passed to the collectives (``CommCounter``; formulas in docs/distributed.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from ..planner import BatchPlan
from .errors import ReplicaDivergence
from .group import RankGroup
from .indexer import index_logits
from .kv_buffer import KVBuffer
from .merge import local_topk, merge_partials, merge_topk
from .model import TinyDecoder
from .nsa import flat_runs
from .partial import attention_output, attention_queries, dense_partial, sparse_partial, value_width
from .scheduler import ForwardBatch

_MAX_POSITION = 2**31 - 1
"""Top-k candidates travel as int32 positions."""

COMM_KINDS = ("queries", "partials", "topk")
"""What ``kv_access = local`` exchanges: the all-gathered queries, the ``(O, LSE)`` partials sent to each
query's owner, the all-gathered top-k candidates (``nsa``)."""


class CommCounter:
    """Bytes one rank sent to and received from its peers, per kind (its own share, kept local, excluded)."""

    def __init__(self) -> None:
        self.sent = dict.fromkeys(COMM_KINDS, 0)
        self.recv = dict.fromkeys(COMM_KINDS, 0)

    def add(self, kind: str, sent: int, recv: int) -> None:
        self.sent[kind] += int(sent)
        self.recv[kind] += int(recv)

    def row(self) -> list[int]:
        """``[sent per kind..., received per kind...]`` in ``COMM_KINDS`` order (bytes)."""
        return [self.sent[k] for k in COMM_KINDS] + [self.recv[k] for k in COMM_KINDS]


@dataclass(frozen=True, eq=False)
class RequestKeys:
    """One request of a forward as this rank sees it.

    Attributes:
        lo, hi: flat token indices ``[lo, hi)`` of the request's queries in the batch.
        slots: ``[L]`` int64 slots of positions ``0 .. L-1`` (L = prefix + extend).
        lanes: ``[L]`` int64 lane of each position's page.
        own_pos: ``[m]`` int64 ascending positions whose page is on this rank's lane; own_slots their slots.
        kc: top-k candidate columns of the request, ``min(index_topk, L)``.
    """

    lo: int
    hi: int
    slots: torch.Tensor
    lanes: torch.Tensor
    own_pos: torch.Tensor
    own_slots: torch.Tensor
    kc: int


@dataclass(frozen=True, eq=False)
class LocalPlan:
    """This rank's view of one forward under ``local`` (built by ``LocalAttention.prepare``).

    Attributes:
        counts: ``[C]`` tokens each rank owns. own: ``[n_r]`` int64 torch flat indices of this rank's tokens.
        rank_order: ``[N]`` int64 torch flat indices of every token, rank 0's first (each rank ascending).
        requests: ``RequestKeys`` per request, batch order.
        runs: ``nsa``: ``(req, b, lo, hi)`` of every rank's run ``[a, b)``, flat tokens ``[lo, hi)``.
    """

    counts: list[int]
    own: torch.Tensor
    rank_order: torch.Tensor
    requests: list[RequestKeys]
    runs: list[tuple[int, int, int, int]]


def local_logits_elements(
    plan: BatchPlan, kv_slots: tuple[torch.Tensor, ...], cp_size: int, page_size: int
) -> np.ndarray:
    """Index-logits elements each rank materialises under ``local``, int64 ``[C]`` (docs/distributed.md).

    For every run ``[a, b)`` of one request's positions that some rank computes (``position_runs``, the
    C-ESTIMATE runs), rank r materialises ``(b - a) x k_r(b)`` elements, ``k_r(b)`` being the request's
    positions ``< b`` whose page is on lane r. Summed over the ranks this is C-ESTIMATE's total
    (``sum (b - a) * b``); the split follows the keys' lanes, not the queries' owners.

    Args: ``plan`` of the forward; ``kv_slots`` per request ``[L0 + E]`` slots; C; P.
    """
    out = np.zeros(cp_size, dtype=np.int64)
    _, req, a, b, _ = flat_runs(plan)
    for i, a_j, b_j in zip(req.tolist(), a.tolist(), b.tolist(), strict=True):
        lanes = (kv_slots[i][:b_j].cpu().numpy() // page_size) % cp_size
        out += (b_j - a_j) * np.bincount(lanes, minlength=cp_size)
    return out


class LocalAttention:
    """Attention + MLP of one layer under ``kv_access = local`` on one rank (SPEC C-MERGE).

    Args:
        group: the CP group. model: the decoder. latent: this rank's lane of the latent pool (``local``
            buffer). index_k: its lane of the index-K pool (``nsa``). fault: called in each layer's partial
            step (debug fault injection).
    """

    def __init__(
        self,
        group: RankGroup,
        model: TinyDecoder,
        latent: KVBuffer,
        index_k: KVBuffer | None,
        fault: Callable[[int, ForwardBatch], None],
    ) -> None:
        self.group, self.model, self.latent, self.index_k, self.fault = group, model, latent, index_k, fault
        self.comm = CommCounter()
        self._digest = hashlib.sha256()

    # ------------------------------------------------------------------------------------- forward
    def prepare(self, batch: ForwardBatch) -> LocalPlan:
        """Reset the counters and build this rank's ``LocalPlan`` of ``batch`` (every rank the same shapes)."""
        self.comm, self._digest = CommCounter(), hashlib.sha256()
        g, plan = self.group, batch.alloc.plan
        layout, k = self.latent.layout, self.model.config.index_topk
        own_lists = [np.flatnonzero(plan.token_owner == r) for r in range(g.world_size)]
        ind = plan.extend_indptr
        requests = []
        for i, slots in enumerate(batch.kv_slots):
            lanes = layout.lane_of(slots)
            own_pos = torch.nonzero(lanes == g.rank).flatten()
            requests.append(
                RequestKeys(
                    int(ind[i]),
                    int(ind[i + 1]),
                    slots,
                    lanes,
                    own_pos,
                    slots[own_pos],
                    min(k, int(slots.shape[0])),
                )
            )
        runs = []
        if self.model.config.nsa:
            _, req, a, b, flat = flat_runs(plan)
            runs = [
                (i, b_j, f, f + b_j - a_j)
                for i, a_j, b_j, f in zip(req.tolist(), a.tolist(), b.tolist(), flat.tolist(), strict=True)
            ]
        longest = max(int(t.shape[0]) for t in batch.kv_slots)
        if longest > _MAX_POSITION:
            raise ConfigError(
                f"kv_access=local exchanges int32 key positions; a request of {longest} tokens "
                f"is over {_MAX_POSITION}"
            )
        dev = g.device
        return LocalPlan(
            counts=[int(o.shape[0]) for o in own_lists],
            own=torch.from_numpy(own_lists[g.rank]).to(dev),
            rank_order=torch.from_numpy(np.concatenate(own_lists)).to(dev),
            requests=requests,
            runs=runs,
        )

    def summary(self, elements: list[int], where: str) -> tuple[np.ndarray, np.ndarray | None, str | None]:
        """After a forward (collective): every rank's bytes, logits counts and top-k digest, in one all-gather.

        Returns:
            ``(comm [C, 2 * len(COMM_KINDS)] int64 sent-then-received bytes, counts [C, layers] int64 or None
            (dense), this rank's SHA-256 hex of its global top-k rows or None (dense))``.

        Raises:
            ReplicaDivergence: (``nsa``) a rank took another global top-k than rank 0 (on every rank).
        """
        g, K = self.group, 2 * len(COMM_KINDS)
        nsa = self.model.config.nsa
        sha = np.frombuffer(self._digest.digest(), dtype=np.int64).tolist() if nsa else []
        row = torch.tensor([self.comm.row() + list(elements) + sha], dtype=torch.int64, device=g.device)
        every = g.gather_rows(row, 1).cpu().numpy()
        if not nsa:
            return every[:, :K], None, None
        shas = every[:, K + len(elements) :]
        bad = [r for r in range(g.world_size) if not np.array_equal(shas[r], shas[0])]
        if bad:
            raise ReplicaDivergence(
                f"{where}: ranks {bad} took another global top-k than rank 0; the merge of "
                f"the candidates must give every rank the same rows (C-MERGE)"
            )
        return every[:, :K], every[:, K : K + len(elements)], self._digest.hexdigest()

    def layer(
        self,
        where: str,
        layer: int,
        h: torch.Tensor,
        x: torch.Tensor,
        lp: LocalPlan,
        batch: ForwardBatch,
        q_own: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """Attention and MLP of ``layer`` for this rank's tokens (collective).

        Args: ``h``/``x`` ``[n_r, hidden]`` hidden state and attention input of the own tokens; ``lp`` from
        ``prepare``; ``q_own``: their ``queries`` if already computed (else computed here, in a step).

        Returns:
            ``(h [n_r, hidden], topk [n_r, index_topk] or None, logits elements materialised)``.
        """
        g, nsa = self.group, self.model.config.nsa
        if q_own is None:
            q_own = g.run(f"{where}: queries", self.queries, layer, x, batch.positions[lp.own])
        q_all = self._all_gather_tokens(q_own, lp)
        if nsa:
            cand, elements = g.run(
                f"{where}: index logits + local top-k", self._candidates, layer, q_all, lp, batch
            )
            gathered = self._all_gather_candidates(cand)
            part, topk = g.run(
                f"{where}: global top-k + sparse partials",
                self._sparse_partials,
                layer,
                q_all,
                gathered,
                lp,
                batch,
            )
            self._digest.update(topk.cpu().numpy().tobytes())
            topk = topk[lp.own]
        else:
            part = g.run(f"{where}: partial attention", self._dense_partials, layer, q_all, lp, batch)
            topk, elements = None, 0
        mine = self._to_owners(part, lp)
        h = g.run(f"{where}: merge + MLP", self._merge_mlp, layer, h, mine)
        return h, topk, elements

    # ------------------------------------------------------------------------------- compute steps
    def _widths(self) -> list[int]:
        c = self.model.config
        qw = c.kv_lora_rank + c.rope_dim if c.kv_mode == "mla" else c.head_dim
        widths = [c.num_heads * qw]
        if c.nsa:
            widths += [c.index_heads * c.index_head_dim, c.index_heads]
        return widths

    def queries(self, layer: int, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Packed query rows ``[n_r, width]`` of tokens ``x [n_r, hidden]`` at ``pos [n_r]``: the attention
        queries, then (``nsa``) the index queries ``q_I`` and gate weights ``w``."""
        parts = [attention_queries(self.model, layer, x, pos).flatten(1)]
        if self.model.config.nsa:
            q_i, w = self.model.index_queries(layer, x, pos)
            parts += [q_i.flatten(1), w]
        return torch.cat(parts, dim=1)

    def _split_queries(self, q_all: torch.Tensor) -> list[torch.Tensor]:
        c = self.model.config
        parts = list(q_all.split(self._widths(), dim=1))
        parts[0] = parts[0].view(q_all.shape[0], c.num_heads, -1)
        if c.nsa:
            parts[1] = parts[1].view(q_all.shape[0], c.index_heads, c.index_head_dim)
        return parts

    def _dense_partials(
        self, layer: int, q_all: torch.Tensor, lp: LocalPlan, batch: ForwardBatch
    ) -> torch.Tensor:
        self.fault(layer, batch)
        (q,) = self._split_queries(q_all)
        part = torch.empty(q.shape[0], q.shape[1], value_width(self.model) + 1, device=q.device)
        for rk in lp.requests:
            rows = self.latent.read(layer, rk.own_slots)
            part[rk.lo : rk.hi] = dense_partial(
                self.model, q[rk.lo : rk.hi], batch.positions[rk.lo : rk.hi], rows, rk.own_pos
            )
        return part

    def _candidates(
        self, layer: int, q_all: torch.Tensor, lp: LocalPlan, batch: ForwardBatch
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        """Local top-k candidates of every query, flat ``[T]`` logits and positions (request blocks
        ``[E_i, kc_i]`` in batch order), and the logits elements materialised."""
        self.fault(layer, batch)
        _, q_i, w = self._split_queries(q_all)
        blocks_l, blocks_p, elements = [], [], 0
        keys = [self.index_k.read(layer, rk.own_slots) for rk in lp.requests]  # type: ignore[union-attr]
        for rk in lp.requests:
            E = rk.hi - rk.lo
            blocks_l.append(torch.full((E, rk.kc), float("-inf"), device=q_all.device))
            blocks_p.append(torch.full((E, rk.kc), -1, dtype=torch.int64, device=q_all.device))
        for i, b, lo, hi in lp.runs:
            rk = lp.requests[i]
            m = int(torch.searchsorted(rk.own_pos, torch.tensor(b, device=rk.own_pos.device)))
            logits = index_logits(q_i[lo:hi], w[lo:hi], keys[i][:m])  # the (b - a) x k_r(b) block
            elements += logits.numel()
            cl, cp = local_topk(logits, rk.own_pos[:m], batch.positions[lo:hi], rk.kc)
            blocks_l[i][lo - rk.lo : hi - rk.lo] = cl
            blocks_p[i][lo - rk.lo : hi - rk.lo] = cp
        return (
            torch.cat([b.flatten() for b in blocks_l]),
            torch.cat([b.flatten() for b in blocks_p]),
        ), elements

    def _sparse_partials(
        self,
        layer: int,
        q_all: torch.Tensor,
        gathered: tuple[torch.Tensor, torch.Tensor],
        lp: LocalPlan,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Global top-k of every query ``[N, k]`` and the sparse-MLA partials over the held selected keys."""
        q = self._split_queries(q_all)[0]
        C, k, rank = self.group.world_size, self.model.config.index_topk, self.group.rank
        g_logit, g_pos = gathered  # [C, T] each
        topk = torch.full((q.shape[0], k), -1, dtype=torch.int64, device=q.device)
        part = torch.empty(q.shape[0], q.shape[1], value_width(self.model) + 1, device=q.device)
        off = 0
        for rk in lp.requests:
            E, kc = rk.hi - rk.lo, rk.kc
            span = slice(off, off + E * kc)
            off += E * kc
            cl = g_logit[:, span].view(C, E, kc).permute(1, 0, 2).reshape(E, C * kc)
            cp = g_pos[:, span].view(C, E, kc).permute(1, 0, 2).reshape(E, C * kc)
            sel = merge_topk(cl, cp, batch.positions[rk.lo : rk.hi], k)
            topk[rk.lo : rk.hi] = sel
            held = (sel >= 0) & (rk.lanes[sel.clamp(min=0)] == rank)

            def read_rows(p: torch.Tensor, rk: RequestKeys = rk) -> torch.Tensor:
                return self.latent.read(layer, rk.slots[p])

            part[rk.lo : rk.hi] = sparse_partial(self.model, q[rk.lo : rk.hi], sel, held, read_rows)
        return part, topk

    def _merge_mlp(self, layer: int, h: torch.Tensor, mine: torch.Tensor) -> torch.Tensor:
        """Merge the C partials of the own queries (``mine [C, n_r, heads, d + 1]``), project, add, MLP."""
        o, _ = merge_partials(mine[..., :-1], mine[..., -1])
        h = h + attention_output(self.model, layer, o)
        return h + self.model.mlp(layer, h)

    # ---------------------------------------------------------------------------------- exchanges
    def _all_gather_tokens(self, rows: torch.Tensor, lp: LocalPlan) -> torch.Tensor:
        """Every rank's token rows ``[n_s, d]`` on every rank, in flat order ``[N, d]`` (pass-Q)."""
        g, C, n_r = self.group, self.group.world_size, lp.counts[self.group.rank]
        out = g.exchange_rows(rows.repeat(C, 1), [n_r] * C, lp.counts)
        row_bytes = rows.shape[1] * rows.element_size()
        self.comm.add("queries", (C - 1) * n_r * row_bytes, (sum(lp.counts) - n_r) * row_bytes)
        flat = torch.empty_like(out)
        flat[lp.rank_order] = out
        return flat

    def _to_owners(self, part: torch.Tensor, lp: LocalPlan) -> torch.Tensor:
        """Partials of every query ``[N, ...]`` to the query's owner: ``[C, n_r, ...]`` from each rank."""
        g, C, n_r = self.group, self.group.world_size, lp.counts[self.group.rank]
        out = g.exchange_rows(part[lp.rank_order], lp.counts, [n_r] * C)
        row_bytes = part[0].numel() * part.element_size() if part.shape[0] else 0
        self.comm.add("partials", (sum(lp.counts) - n_r) * row_bytes, (C - 1) * n_r * row_bytes)
        return out.view(C, n_r, *part.shape[1:])

    def _all_gather_candidates(
        self, cand: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's flat candidates ``[T]`` (logits, positions) as ``[C, T]`` each, rank order.

        One all-gather of ``[T, 2]`` int32: the logit's float32 bits and the position (8 bytes a candidate).
        """
        g, C = self.group, self.group.world_size
        logit, pos = cand
        packed = torch.stack((logit.view(torch.int32), pos.to(torch.int32)), dim=1)
        out = g.gather_rows(packed, packed.shape[0]).view(C, -1, 2)
        b = (C - 1) * packed.numel() * packed.element_size()
        self.comm.add("topk", b, b)
        return out[..., 0].contiguous().view(torch.float32), out[..., 1].to(torch.int64)
