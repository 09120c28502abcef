"""A tiny decoder with seeded random weights, and its single-process reference forward.

Float32 throughout. Each layer: RMSNorm, attention (rotary positions on global positions), residual,
RMSNorm, SwiGLU MLP, residual; a final RMSNorm. Two KV modes:

- ``mla`` (default): one latent KV row per token, ``[c_kv (kv_lora_rank) | k_rope (rope_dim)]``, 576 wide
  with the DeepSeek sizes 512 + 64. Queries are kept in the absorbed form (one latent query and one rotary
  query per head), so attention reads only the latent rows, as MLA decoding does.
- ``mha``: plain multi-head attention, row ``[K (heads*head_dim, rotary applied) | V (heads*head_dim)]``.

Attention is ``dense`` (causal over every earlier position) or ``nsa`` (DeepSeek-V3.2 sparse attention, MLA
only, SPEC C-NSA): a lightning indexer (index queries ``q_I [index_heads, index_head_dim]``, one index key
``k_I [index_head_dim]`` per token with rotary on its first ``index_rope_dim`` dims, gate weights
``w [index_heads]``) scores every visible key, top-k keeps ``index_topk`` of them, and MLA attends only to
those (``indexer.py`` holds the arithmetic).

The layer functions are split at the points where the CP executor interleaves its KV writes and reads
(``kv_rows`` -> write -> fence -> read -> ``attention``), so the executor and ``reference_forward`` run the
same arithmetic; only the reference sees the whole sequence at once, with no pages, slots or plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import check_int
from ..errors import ConfigError
from .indexer import index_logits, mask_causal, near_ties, select_topk, sparse_mla

KV_MODES = ("mla", "mha")
ATTENTIONS = ("dense", "nsa")
INDEXER_SEED_OFFSET = 1_000_003
"""The indexer's weights are drawn from ``seed + INDEXER_SEED_OFFSET`` (a generator of their own)."""
LM_HEAD_SEED_OFFSET = 999_983
"""The LM head (greedy decoding) is drawn from ``seed + LM_HEAD_SEED_OFFSET`` (below the indexer's offset,
so every allowed seed stays a uint64)."""


@dataclass(frozen=True, kw_only=True)
class TinyDecoderConfig:
    """Sizes and seed of the tiny decoder.

    Attributes:
        vocab_size: token ids are in ``[0, vocab_size)`` (default 512).
        hidden_size: residual width (default 64).
        num_layers: decoder layers (default 2).
        num_heads: attention heads (default 4).
        kv_mode: ``"mla"`` (one latent row per token) or ``"mha"`` (K and V of every head).
        kv_lora_rank: MLA latent width (default 512).
        rope_dim: MLA rotary width, shared by all heads (default 64; even).
        head_dim: per-head width of MHA q/k/v and of the MLA value projection (default 16; even).
        mlp_size: SwiGLU inner width (default 128).
        rope_theta: rotary base (default 10000).
        rms_eps: RMSNorm epsilon (default 1e-6).
        seed: weight seed, an int in ``[0, 2**64 - 1 - INDEXER_SEED_OFFSET]`` (torch seeds are uint64); the
            same seed gives bit-identical weights in every process (default 0).
        attention: ``"dense"`` (default) or ``"nsa"`` (indexer + top-k + sparse MLA; needs ``kv_mode="mla"``).
        index_heads: indexer query heads H (default 64, DeepSeek-V3.2).
        index_head_dim: width of ``q_I`` heads and of ``k_I`` (default 128); the index-K pool row width.
        index_rope_dim: leading dims of ``q_I`` / ``k_I`` that get rotary embedding (default 64; even).
        index_topk: keys each query keeps, k (default 2048).
        index_round: test knob: round ``q_I``, ``k_I`` and ``w`` to integers, so every index logit is a
            small exact integer (the same in any summation order) and rows tie often (default False).

    Raises:
        ConfigError: a size below 1, an odd rotary width, an unknown ``kv_mode`` or ``attention``,
            ``nsa`` without ``mla``, or ``index_rope_dim > index_head_dim``.
    """

    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    kv_mode: str = "mla"
    kv_lora_rank: int = 512
    rope_dim: int = 64
    head_dim: int = 16
    mlp_size: int = 128
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = 0
    attention: str = "dense"
    index_heads: int = 64
    index_head_dim: int = 128
    index_rope_dim: int = 64
    index_topk: int = 2048
    index_round: bool = False

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "kv_lora_rank",
            "rope_dim",
            "head_dim",
            "mlp_size",
            "index_heads",
            "index_head_dim",
            "index_rope_dim",
            "index_topk",
        ):
            check_int(name, getattr(self, name), 1)
        check_int("seed", self.seed, 0, 2**64 - 1 - INDEXER_SEED_OFFSET)  # torch seeds are uint64
        if self.kv_mode not in KV_MODES:
            raise ConfigError(f"kv_mode={self.kv_mode!r} is not a KV mode; use one of {', '.join(KV_MODES)}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"attention={self.attention!r} unknown; use one of {', '.join(ATTENTIONS)}")
        if self.attention == "nsa" and self.kv_mode != "mla":
            raise ConfigError(
                f"attention='nsa' is sparse MLA and needs kv_mode='mla', got kv_mode={self.kv_mode!r}"
            )
        if self.index_rope_dim % 2 or self.index_rope_dim > self.index_head_dim:
            raise ConfigError(
                f"index_rope_dim must be even and <= index_head_dim={self.index_head_dim}, "
                f"got {self.index_rope_dim}"
            )
        rot = self.rope_dim if self.kv_mode == "mla" else self.head_dim
        if rot % 2:
            raise ConfigError(
                f"the rotary width must be even, got {rot} ({'rope_dim' if self.kv_mode == 'mla' else 'head_dim'})"
            )

    @property
    def kv_row_width(self) -> int:
        """Floats per token and layer in the KV cache: ``kv_lora_rank + rope_dim`` (mla) or ``2*heads*head_dim``."""
        if self.kv_mode == "mla":
            return self.kv_lora_rank + self.rope_dim
        return 2 * self.num_heads * self.head_dim

    @property
    def nsa(self) -> bool:
        """Whether the layers use sparse attention (``attention == "nsa"``)."""
        return self.attention == "nsa"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: ``x / sqrt(mean(x^2) + eps) * weight``; shapes ``[..., d]`` and ``[d]``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half rotary embedding of ``x [n, ..., d]`` (d even) at global ``positions [n]`` (int64).

    Angles are ``position * theta^(-2i/d)`` in float32, elementwise, so a token gets the same rotation
    whichever rank or batch computes it.
    """
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)  # [d/2]
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [n, d/2]
    shape = (ang.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = ang.cos().reshape(shape), ang.sin().reshape(shape)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class TinyDecoder:
    """The tiny decoder's weights and layer functions (float32, on ``device``).

    Args:
        config: ``TinyDecoderConfig``; weights are drawn from ``torch.Generator().manual_seed(seed)`` on
            the CPU, then moved, so every process and device gets the same values. The indexer's weights
            come from a second generator (``seed + INDEXER_SEED_OFFSET``), so an ``nsa`` model has exactly
            the weights of the dense model of the same seed plus its indexer; the LM head ``[hidden,
            vocab]`` of greedy decoding from a third (``seed + LM_HEAD_SEED_OFFSET``).
        device: torch device of the weights and of every result.
    """

    def __init__(self, config: TinyDecoderConfig, device: str | torch.device = "cpu") -> None:
        self.config = c = config
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(c.seed)
        g_index = torch.Generator().manual_seed(c.seed + INDEXER_SEED_OFFSET)

        def w(*shape: int, fan_in: int | None = None, gen: torch.Generator = g) -> torch.Tensor:
            fan = fan_in if fan_in is not None else shape[0]
            return (torch.randn(*shape, generator=gen, dtype=torch.float32) / fan**0.5).to(self.device)

        def norm_w(d: int, gen: torch.Generator = g) -> torch.Tensor:
            return (1.0 + 0.1 * torch.randn(d, generator=gen, dtype=torch.float32)).to(self.device)

        H, nh, hd = c.hidden_size, c.num_heads, c.head_dim
        self.embedding = w(c.vocab_size, H, fan_in=1)  # [vocab, H]
        self.layers: list[dict[str, torch.Tensor]] = []
        for _ in range(c.num_layers):
            p = {
                "attn_norm": norm_w(H),
                "mlp_norm": norm_w(H),
                "w_o": w(nh * hd, H),
                "w_gate": w(H, c.mlp_size),
                "w_up": w(H, c.mlp_size),
                "w_down": w(c.mlp_size, H),
            }
            if c.kv_mode == "mla":
                R, D = c.rope_dim, c.kv_lora_rank
                p.update(
                    w_dkv=w(H, D),
                    kv_norm=norm_w(D),
                    w_kr=w(H, R),
                    w_q_lat=w(H, nh * D),
                    w_q_rope=w(H, nh * R),
                    w_uv=w(nh, D, hd, fan_in=D),
                )
            else:
                p.update(w_q=w(H, nh * hd), w_k=w(H, nh * hd), w_v=w(H, nh * hd))
            if c.nsa:  # from the indexer's own generator: the other weights equal the dense model's
                IH, ID, gi = c.index_heads, c.index_head_dim, g_index
                p.update(
                    w_qi=w(H, IH * ID, gen=gi),
                    w_ki=w(H, ID, gen=gi),
                    ki_norm=norm_w(ID, gen=gi),
                    w_gate_i=w(H, IH, gen=gi),
                )
            self.layers.append(p)
        self.final_norm_w = norm_w(H)
        self.lm_head = w(H, c.vocab_size, gen=torch.Generator().manual_seed(c.seed + LM_HEAD_SEED_OFFSET))

    # ------------------------------------------------------------------------------------------ layers
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``[n]`` int64 token ids -> ``[n, hidden]`` float32 hidden states."""
        return self.embedding[token_ids.to(self.device)]

    def attn_input(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """Pre-attention RMSNorm of ``h [n, hidden]`` -> ``[n, hidden]``."""
        return rms_norm(h, self.layers[layer]["attn_norm"], self.config.rms_eps)

    def kv_rows(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """KV-cache rows of tokens with attention input ``x [n, hidden]`` at global ``positions [n]``.

        Returns ``[n, kv_row_width]`` float32: ``[rmsnorm(x W_dkv) | rope(x W_kr)]`` (mla) or
        ``[rope(K) | V]`` (mha). This is what a rank writes into its lane.
        """
        c, p = self.config, self.layers[layer]
        if c.kv_mode == "mla":
            latent = rms_norm(x @ p["w_dkv"], p["kv_norm"], c.rms_eps)
            return torch.cat((latent, rotary(x @ p["w_kr"], positions, c.rope_theta)), dim=-1)
        k = rotary((x @ p["w_k"]).view(x.shape[0], c.num_heads, c.head_dim), positions, c.rope_theta)
        return torch.cat((k.flatten(1), x @ p["w_v"]), dim=-1)

    def attention(
        self,
        layer: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        rows: torch.Tensor,
        key_positions: torch.Tensor,
    ) -> torch.Tensor:
        """Causal attention of queries ``x [n, hidden]`` at ``positions [n]`` over KV ``rows [k, W]``.

        ``key_positions [k]`` are the global positions of the rows; query q sees keys with
        ``key_position <= position[q]``. Returns the attention output after ``w_o``, ``[n, hidden]``.
        """
        c, p = self.config, self.layers[layer]
        n, nh = x.shape[0], c.num_heads
        if c.kv_mode == "mla":
            D = c.kv_lora_rank
            q = self.absorbed_queries(layer, x, positions)  # [n, nh, D+R]
            scores = torch.einsum("qhw,kw->hqk", q, rows) * self.sm_scale
            probs = _causal_softmax(scores, positions, key_positions)
            out_lat = torch.einsum("hqk,kd->qhd", probs, rows[:, :D])  # [n, nh, D]
            out = torch.einsum("qhd,hde->qhe", out_lat, p["w_uv"])  # [n, nh, hd]
        else:
            hd = c.head_dim
            q = rotary((x @ p["w_q"]).view(n, nh, hd), positions, c.rope_theta)
            k = rows[:, : nh * hd].reshape(-1, nh, hd)
            v = rows[:, nh * hd :].reshape(-1, nh, hd)
            probs = _causal_softmax(torch.einsum("qhd,khd->hqk", q, k) / hd**0.5, positions, key_positions)
            out = torch.einsum("hqk,khd->qhd", probs, v)
        return out.reshape(n, nh * c.head_dim) @ p["w_o"]

    @property
    def sm_scale(self) -> float:
        """MLA softmax scale ``1 / sqrt(kv_lora_rank + rope_dim)``."""
        return 1.0 / (self.config.kv_lora_rank + self.config.rope_dim) ** 0.5

    def absorbed_queries(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """MLA queries in absorbed form, ``[n, heads, kv_lora_rank + rope_dim]``: ``[q_lat | rope(q_rope)]``."""
        c, p = self.config, self.layers[layer]
        n, nh = x.shape[0], c.num_heads
        q_lat = (x @ p["w_q_lat"]).view(n, nh, c.kv_lora_rank)
        q_rope = rotary((x @ p["w_q_rope"]).view(n, nh, c.rope_dim), positions, c.rope_theta)
        return torch.cat((q_lat, q_rope), dim=-1)

    # --------------------------------------------------------------------------------- indexer (nsa)
    def index_k_rows(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Index keys ``k_I`` of tokens ``x [n, hidden]`` at global ``positions [n]``: ``[n, index_head_dim]``.

        ``rmsnorm(x W_k)`` with rotary on the first ``index_rope_dim`` dims; the row the owner rank writes
        into the index-K pool (SPEC C-NSA).
        """
        c, p = self.config, self.layers[layer]
        k = _rope_leading(
            rms_norm(x @ p["w_ki"], p["ki_norm"], c.rms_eps), positions, c.index_rope_dim, c.rope_theta
        )
        return k.round() if c.index_round else k

    def index_queries(
        self, layer: int, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Index queries and gate weights of tokens ``x [n, hidden]`` at ``positions [n]``.

        Returns ``(q_I [n, index_heads, index_head_dim], w [n, index_heads])`` float32, rotary on the first
        ``index_rope_dim`` dims of each head, ``w`` scaled by ``index_heads ** -0.5``.
        """
        c, p = self.config, self.layers[layer]
        q = (x @ p["w_qi"]).view(x.shape[0], c.index_heads, c.index_head_dim)
        w = (x @ p["w_gate_i"]) * c.index_heads**-0.5
        q = _rope_leading(q, positions, c.index_rope_dim, c.rope_theta)
        return (q.round(), w.round()) if c.index_round else (q, w)

    def sparse_attention(
        self, layer: int, x: torch.Tensor, positions: torch.Tensor, topk: torch.Tensor, read_rows
    ) -> torch.Tensor:
        """Sparse MLA of queries ``x [n, hidden]`` at ``positions [n]`` over their ``topk [n, k]`` key positions.

        ``read_rows`` maps ``[m]`` key positions to ``[m, kv_row_width]`` latent rows. Returns the attention
        output after ``w_uv`` and ``w_o``, ``[n, hidden]`` (SPEC C-NSA).
        """
        c, p = self.config, self.layers[layer]
        q = self.absorbed_queries(layer, x, positions)
        out_lat = sparse_mla(q, topk, read_rows, c.kv_lora_rank, self.sm_scale)  # [n, nh, D]
        out = torch.einsum("qhd,hde->qhe", out_lat, p["w_uv"])
        return out.reshape(x.shape[0], c.num_heads * c.head_dim) @ p["w_o"]

    def mlp(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """SwiGLU MLP of ``rmsnorm(h)``, ``[n, hidden] -> [n, hidden]`` (without the residual)."""
        p = self.layers[layer]
        x = rms_norm(h, p["mlp_norm"], self.config.rms_eps)
        return (torch.nn.functional.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm, ``[n, hidden] -> [n, hidden]``: the "final hidden states" compared across runs."""
        return rms_norm(h, self.final_norm_w, self.config.rms_eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Tied-embedding logits of final hidden states ``[n, hidden] -> [n, vocab]``."""
        return h @ self.embedding.T

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM-head logits of final hidden states ``[n, hidden] -> [n, vocab]`` float32 (greedy decoding)."""
        return h @ self.lm_head

    def next_tokens(self, h: torch.Tensor) -> torch.Tensor:
        """Greedy next token of each final hidden state ``[n, hidden]``: ``[n]`` int64, ties to the lower id."""
        return torch.argmax(self.lm_logits(h), dim=-1)

    def weights_digest(self) -> float:
        """Sum of all weights as a float64 checksum (equal in every process built from the same seed)."""
        tensors = [self.embedding, self.final_norm_w, self.lm_head] + [
            t for p in self.layers for t in p.values()
        ]
        return float(sum(t.double().sum().item() for t in tensors))

    # ------------------------------------------------------------------------------------- reference
    def reference_forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Single-process reference: final hidden states ``[T, hidden]`` of one whole sequence ``[T]``.

        Plain causal attention over the full sequence (positions ``0..T-1``), no KV cache, no pages,
        no plan: what every CP forward of the same request must reproduce, position by position.
        """
        return self.reference(token_ids).hidden

    def reference(self, token_ids: torch.Tensor) -> Reference:
        """``reference_forward`` plus, for ``nsa``, each layer's top-k and near-tie rows (``Reference``).

        The indexer scores each query against every key of the one contiguous sequence (one ``[T, T]``
        logits block, causally masked); the sparse attention reads the selected rows of a contiguous
        latent tensor.
        """
        c = self.config
        ids = torch.as_tensor(token_ids, dtype=torch.int64, device=self.device)
        pos = torch.arange(ids.shape[0], dtype=torch.int64, device=self.device)
        h = self.embed(ids)
        topks, ties = [], []
        for layer in range(c.num_layers):
            x = self.attn_input(layer, h)
            rows = self.kv_rows(layer, x, pos)
            if c.nsa:
                q, w = self.index_queries(layer, x, pos)
                logits = mask_causal(index_logits(q, w, self.index_k_rows(layer, x, pos)), pos)
                topk = select_topk(logits, pos, c.index_topk)
                topks.append(topk)
                ties.append(near_ties(logits, pos, c.index_topk))
                h = h + self.sparse_attention(layer, x, pos, topk, rows.__getitem__)
            else:
                h = h + self.attention(layer, x, pos, rows, pos)
            h = h + self.mlp(layer, h)
        if not c.nsa:
            return Reference(self.final_norm(h), None, None)
        return Reference(self.final_norm(h), torch.stack(topks, 1), torch.stack(ties, 1))


@dataclass(frozen=True, eq=False)
class Reference:
    """Single-process reference of one sequence of T tokens.

    Attributes:
        hidden: ``[T, hidden]`` float32 final hidden states.
        topk: ``nsa`` only: ``[T, layers, index_topk]`` int64 selected key positions (ascending, -1 padded).
        near_tie: ``nsa`` only: ``[T, layers]`` bool, rows whose k-th and (k+1)-th logits are within 1e-6
            relative (``indexer.near_ties``): a CP run may select differently there.
    """

    hidden: torch.Tensor
    topk: torch.Tensor | None
    near_tie: torch.Tensor | None


def _rope_leading(x: torch.Tensor, positions: torch.Tensor, rope_dim: int, theta: float) -> torch.Tensor:
    """Rotary on the first ``rope_dim`` dims of the last axis of ``x [n, ..., d]``; the rest unchanged."""
    return torch.cat((rotary(x[..., :rope_dim], positions, theta), x[..., rope_dim:]), dim=-1)


def _causal_softmax(scores: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores [h, q, k]`` over keys with ``k_pos <= q_pos`` (others get probability 0)."""
    masked = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.softmax(masked, dim=-1)
