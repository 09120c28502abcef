"""Per-rank context-parallel prefill forward over the shared paged KV (SPEC C-LAYOUT, C-GATHER).

Rank r, for one ``ForwardBatch``:

1. takes its tokens, ``own = flatnonzero(token_owner == r)`` (ascending flat order; C-OWNER-EQ-COMPUTE);
2. embeds only those tokens;
3. per layer: computes their K/V rows and writes them into its own lane (``write_slots``), then the write
   fence (a collective) so every rank's rows of this layer are visible; then causal attention of its
   queries over every earlier position of the request, read from the rank-major view (``read_slots``,
   prefix pages of any lane included), and the MLP; its hidden states stay local for the next layer;
4. after the last layer pads its rows to ``max_rank_tokens`` and all-gathers; ``gathered[gather_index]``
   is the batch's final hidden states in flat order (C-GATHER).

Every step where a rank can fail ends in ``RankGroup.run`` (error agreement), so no rank is left behind
in a collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import InjectedFault
from .group import RankGroup
from .kv_buffer import KVBuffer
from .model import TinyDecoder
from .scheduler import ForwardBatch


@dataclass(frozen=True)
class WriteAudit:
    """What one rank's write of one layer changed in the whole KV buffer (``audit_writes`` mode).

    Ranks write one after another; each compares the bits of every row of every layer before and after
    its own write. Direct write holds when ``rows_outside_lane == rows_unexpected == rows_misread == 0``:
    the rank changed only rows of its own lane, only the rows of its own tokens, and each of those reads
    back through ``read_slots`` as written; every other row, guard rows of other lanes included, kept its
    bits. (``rows_changed`` can be below ``rows_written`` when a recycled page already held the same rows,
    e.g. a request repeating another's tokens at the same positions.)

    Attributes:
        forward, layer, rank: where.
        rows_written: tokens the rank wrote (its own tokens of the forward).
        rows_changed: rows, over all layers, whose bits changed during the rank's turn.
        rows_outside_lane: changed rows outside the rank's lane ``[r*Q*P, (r+1)*Q*P)`` or in another layer.
        rows_unexpected: changed rows other than ``read_slots(own slots)`` of this layer.
        rows_misread: own tokens whose row, read back at ``read_slots(slot)``, differs from what was written.
    """

    forward: int
    layer: int
    rank: int
    rows_written: int
    rows_changed: int
    rows_outside_lane: int
    rows_unexpected: int
    rows_misread: int


@dataclass(frozen=True, eq=False)
class ForwardOutput:
    """Result of one CP forward on one rank.

    Attributes:
        hidden: ``[N, hidden]`` float32 final hidden states in flat (request, position) order, the same on
            every rank (after the gather-back).
        own_tokens: extend tokens this rank computed (``per_rank_tokens[rank]``).
        audits: ``WriteAudit`` per layer (empty unless ``audit_writes``).
    """

    hidden: torch.Tensor
    own_tokens: int
    audits: tuple[WriteAudit, ...]


class CPExecutor:
    """Runs CP prefill forwards of ``model`` on one rank of ``group`` over the KV buffer ``kv``.

    Args:
        group: this rank's ``RankGroup``.
        model: the ``TinyDecoder`` (same seed on every rank).
        kv: the group's ``KVBuffer`` (layers = ``model.config.num_layers``).
        audit_writes: debug: ranks write in turn and record ``WriteAudit`` (C barriers per layer).
        fault_rank: debug: this rank raises ``InjectedFault`` in layer 0's attention of every forward.
    """

    def __init__(
        self, group: RankGroup, model: TinyDecoder, kv: KVBuffer, *, audit_writes: bool = False,
        fault_rank: int | None = None,
    ) -> None:  # fmt: skip
        self.group, self.model, self.kv = group, model, kv
        self.audit_writes = audit_writes
        self.fault_rank = fault_rank

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """One CP prefill forward (collective: every rank calls it with the same ``batch``).

        Returns:
            ``ForwardOutput`` with the whole batch's final hidden states ``[N, hidden]`` in flat order.

        Raises:
            LaneWriteError: a token's slot is not in this rank's lane (on every rank).
            Any error of any rank, re-raised on every rank (``RankGroup.agree``).
        """
        g, plan, f = self.group, batch.alloc.plan, batch.index
        own = np.flatnonzero(plan.token_owner == g.rank)  # [n_r] ascending flat token indices
        idx = torch.from_numpy(own).to(g.device)
        loc, pos, req = batch.out_cache_loc[idx], batch.positions[idx], batch.token_req[own]
        h = g.run(f"forward {f}: embed", self.model.embed, batch.token_ids[idx])
        audits: list[WriteAudit] = []
        for layer in range(self.model.config.num_layers):
            where = f"forward {f} layer {layer}"
            if self.audit_writes:
                x, audit = self._audited_write(where, f, layer, h, pos, loc)
                audits.append(audit)
            else:
                x = g.run(f"{where}: K/V write (write fence)", self._write_kv, layer, h, pos, loc)
            self.kv.publish(g, layer)
            h = g.run(f"{where}: attention + MLP", self._attend_mlp, layer, h, x, pos, req, batch)
        out = g.run(f"forward {f}: final norm", self.model.final_norm, h)
        gathered = g.gather_rows(out, plan.max_rank_tokens)  # [C*M, hidden], rank order
        hidden = gathered[torch.as_tensor(plan.gather_index.copy(), device=g.device)]  # C-GATHER
        return ForwardOutput(hidden=hidden, own_tokens=int(own.shape[0]), audits=tuple(audits))

    # ---------------------------------------------------------------------------------------- steps
    def _write_kv(self, layer: int, h: torch.Tensor, pos: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        """Attention input ``x`` of this rank's tokens; their K/V rows go to its own lane. Returns ``x``."""
        return self._write_rows(layer, h, pos, loc)[0]

    def _write_rows(self, layer, h, pos, loc) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.model.attn_input(layer, h)
        rows = self.model.kv_rows(layer, x, pos)
        self.kv.write(layer, loc, rows)
        return x, rows

    def _attend_mlp(self, layer, h, x, pos, req, batch: ForwardBatch) -> torch.Tensor:
        """Causal attention of this rank's queries over the shared KV, then the MLP; ``[n_r, hidden]``.

        A request's queries read the slots of positions ``0 .. max query position`` (prefix pages and
        this forward's pages of every lane) through ``read_slots``.
        """
        if self.fault_rank == self.group.rank and layer == 0:
            raise InjectedFault(self.group.rank, f"forward {batch.index} layer 0 attention")
        attn = torch.zeros_like(x)
        for i in np.unique(req).tolist():
            sel = torch.from_numpy(np.flatnonzero(req == i)).to(x.device)
            q_pos = pos[sel]
            n_keys = int(q_pos.max()) + 1
            rows = self.kv.read(layer, batch.kv_slots[i][:n_keys])
            key_pos = torch.arange(n_keys, dtype=torch.int64, device=x.device)
            attn[sel] = self.model.attention(layer, x[sel], q_pos, rows, key_pos)
        h = h + attn
        return h + self.model.mlp(layer, h)

    def _audited_write(self, where: str, f: int, layer: int, h, pos, loc) -> tuple[torch.Tensor, WriteAudit]:
        """``_write_kv`` with the ranks taking turns, each diffing the whole buffer around its write."""
        g = self.group
        x, audit = None, None
        for turn in range(g.world_size):
            step = f"{where}: audited K/V write, turn of rank {turn}"
            if turn == g.rank:
                x, audit = g.run(step, self._audit_turn, f, layer, h, pos, loc)
            else:
                g.barrier_ok(step)
        return x, audit  # type: ignore[return-value]

    def _audit_turn(self, f: int, layer: int, h, pos, loc) -> tuple[torch.Tensor, WriteAudit]:
        before = self.kv.storage.clone()
        x, written = self._write_rows(layer, h, pos, loc)
        after = self.kv.storage
        changed = (before.view(torch.int32) != after.view(torch.int32)).any(dim=-1)  # [layers, rows]
        layers, rows = (t.cpu() for t in torch.nonzero(changed, as_tuple=True))
        a, b = self.kv.lane_rows()
        outside = (layers != layer) | (rows < a) | (rows >= b)
        expected = set(self.kv.layout.read_slots(loc).cpu().tolist())
        unexpected = sum(
            1
            for lay, r in zip(layers.tolist(), rows.tolist(), strict=True)
            if lay != layer or r not in expected
        )
        misread = int(
            (self.kv.read(layer, loc).view(torch.int32) != written.view(torch.int32)).any(dim=-1).sum()
        )
        audit = WriteAudit(f, layer, self.group.rank, int(loc.shape[0]), int(rows.shape[0]), int(outside.sum()),
                           unexpected, misread)  # fmt: skip
        return x, audit
