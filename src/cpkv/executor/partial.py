"""The tiny decoder's attention split for the cross-rank merge (SPEC C-MERGE): queries, partials, output.

Under ``kv_access = local`` a query's attention is computed in three parts on different ranks:

1. ``attention_queries`` on the query's owner (the rows that are all-gathered: pass-Q);
2. ``dense_partial`` / ``sparse_partial`` on every rank, over the keys that rank holds, giving
   ``(O_r, LSE_r)`` packed as ``[n, heads, value_width + 1]`` (``O_r`` then ``LSE_r``), the rows sent back;
3. ``attention_output`` on the owner, after ``merge.merge_partials``: the output projections.

The arithmetic is that of ``TinyDecoder.attention`` and ``TinyDecoder.sparse_attention``, regrouped so the
softmax of each rank covers only its own keys; the merge makes it the softmax over the union.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .indexer import SPARSE_ROWS_BUDGET
from .merge import shard_softmax
from .model import TinyDecoder, rotary


def attention_queries(
    model: TinyDecoder, layer: int, x: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Queries of tokens ``x [n, hidden]`` at ``positions [n]``: ``[n, heads, query_width]`` float32.

    MLA: the absorbed ``[q_lat | rope(q_rope)]`` (576 wide with DeepSeek sizes); MHA: ``rope(x W_q)``.
    """
    c = model.config
    if c.kv_mode == "mla":
        return model.absorbed_queries(layer, x, positions)
    q = (x @ model.layers[layer]["w_q"]).view(x.shape[0], c.num_heads, c.head_dim)
    return rotary(q, positions, c.rope_theta)


def value_width(model: TinyDecoder) -> int:
    """Width of one head's partial output ``O_r``: ``kv_lora_rank`` (MLA latent) or ``head_dim`` (MHA)."""
    c = model.config
    return c.kv_lora_rank if c.kv_mode == "mla" else c.head_dim


def dense_partial(
    model: TinyDecoder, q: torch.Tensor, q_pos: torch.Tensor, rows: torch.Tensor, key_pos: torch.Tensor
) -> torch.Tensor:
    """Causal attention of queries over the keys one rank holds, as a C-MERGE partial.

    Args:
        model: the decoder. q: ``[n, heads, query_width]`` (``attention_queries``). q_pos: ``[n]`` int64.
        rows: ``[m, kv_row_width]`` the rank's own KV rows of the request. key_pos: ``[m]`` their positions.

    Returns:
        ``[n, heads, value_width + 1]`` float32: ``O_r`` then ``LSE_r`` (``-inf``, with ``O_r = 0``, for a
        query that sees none of these keys).
    """
    c = model.config
    nh = c.num_heads
    if c.kv_mode == "mla":
        scores = torch.einsum("qhw,kw->qhk", q, rows) * model.sm_scale
        values = rows[:, : c.kv_lora_rank]
        eq = "qhk,kd->qhd"
    else:
        hd = c.head_dim
        scores = torch.einsum("qhd,khd->qhk", q, rows[:, : nh * hd].reshape(-1, nh, hd)) / hd**0.5
        values = rows[:, nh * hd :].reshape(-1, nh, hd)
        eq = "qhk,khd->qhd"
    scores = scores.masked_fill(key_pos[None, None, :] > q_pos[:, None, None], float("-inf"))
    probs, lse = shard_softmax(scores)
    return torch.cat((torch.einsum(eq, probs, values), lse[..., None]), dim=-1)


def sparse_partial(
    model: TinyDecoder,
    q: torch.Tensor,
    topk: torch.Tensor,
    held: torch.Tensor,
    read_rows: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Sparse MLA of queries over the selected positions one rank holds, as a C-MERGE partial.

    Args:
        model: the decoder (``nsa``). q: ``[n, heads, 576]`` absorbed queries.
        topk: ``[n, k]`` int64 global top-k positions (-1 padded). held: ``[n, k]`` bool, the entries whose
            key is on this rank's lane.
        read_rows: ``[m]`` positions (all held) -> ``[m, kv_row_width]`` latent rows of the own lane.

    Returns:
        ``[n, heads, kv_lora_rank + 1]`` float32 ``O_r`` then ``LSE_r``. Only held rows are read, a query
        chunk at a time (``SPARSE_ROWS_BUDGET`` floats of gathered rows at most).
    """
    c = model.config
    n, nh, W = q.shape
    D = c.kv_lora_rank
    # Held entries first (stable: ascending positions), then keep the widest row's count of them.
    order = torch.sort((~held).to(torch.int8), dim=1, stable=True).indices
    k_eff = int(held.sum(1).max()) if n else 0
    sel = torch.gather(topk, 1, order)[:, :k_eff]
    valid = torch.gather(held, 1, order)[:, :k_eff]
    out = torch.empty(n, nh, D + 1, dtype=torch.float32, device=q.device)
    step = max(1, SPARSE_ROWS_BUDGET // (max(k_eff, 1) * W))
    for c0 in range(0, n, step):
        s, v = sel[c0 : c0 + step], valid[c0 : c0 + step]
        rows = torch.zeros(s.shape[0], k_eff, W, dtype=torch.float32, device=q.device)
        rows[v] = read_rows(s[v])
        scores = torch.einsum("nhw,nkw->nhk", q[c0 : c0 + step], rows) * model.sm_scale
        probs, lse = shard_softmax(scores.masked_fill(~v[:, None, :], float("-inf")))
        out[c0 : c0 + step, :, :D] = torch.einsum("nhk,nkd->nhd", probs, rows[..., :D])
        out[c0 : c0 + step, :, D] = lse
    return out


def attention_output(model: TinyDecoder, layer: int, o: torch.Tensor) -> torch.Tensor:
    """Output projections of merged attention ``o [n, heads, value_width]`` -> ``[n, hidden]``.

    MLA: ``w_uv`` (latent -> per-head values) then ``w_o``; MHA: ``w_o``.
    """
    c, p = model.config, model.layers[layer]
    if c.kv_mode == "mla":
        o = torch.einsum("qhd,hde->qhe", o, p["w_uv"])
    return o.reshape(o.shape[0], c.num_heads * c.head_dim) @ p["w_o"]
