"""A tiny decoder with seeded random weights, and its single-process reference forward.

Float32 throughout. Each layer: RMSNorm, attention (rotary positions on global positions), residual,
RMSNorm, SwiGLU MLP, residual; a final RMSNorm. Two KV modes:

- ``mla`` (default): one latent KV row per token, ``[c_kv (kv_lora_rank) | k_rope (rope_dim)]``, 576 wide
  with the DeepSeek sizes 512 + 64. Queries are kept in the absorbed form (one latent query and one rotary
  query per head), so attention reads only the latent rows, as MLA decoding does.
- ``mha``: plain multi-head attention, row ``[K (heads*head_dim, rotary applied) | V (heads*head_dim)]``.

The layer functions are split at the points where the CP executor interleaves its KV writes and reads
(``kv_rows`` -> write -> fence -> read -> ``attention``), so the executor and ``reference_forward`` run the
same arithmetic; only the reference sees the whole sequence at once, with no pages, slots or plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import check_int
from ..errors import ConfigError

KV_MODES = ("mla", "mha")


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
        seed: weight seed; the same seed gives bit-identical weights in every process (default 0).

    Raises:
        ConfigError: a size below 1, an odd rotary width, or an unknown ``kv_mode``.
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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "kv_lora_rank", "rope_dim",
                     "head_dim", "mlp_size"):  # fmt: skip
            check_int(name, getattr(self, name), 1)
        check_int("seed", self.seed, 0)
        if self.kv_mode not in KV_MODES:
            raise ConfigError(f"kv_mode={self.kv_mode!r} is not a KV mode; use one of {', '.join(KV_MODES)}")
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
            the CPU, then moved, so every process and device gets the same values.
        device: torch device of the weights and of every result.
    """

    def __init__(self, config: TinyDecoderConfig, device: str | torch.device = "cpu") -> None:
        self.config = c = config
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(c.seed)

        def w(*shape: int, fan_in: int | None = None) -> torch.Tensor:
            fan = fan_in if fan_in is not None else shape[0]
            return (torch.randn(*shape, generator=g, dtype=torch.float32) / fan**0.5).to(self.device)

        def norm_w(d: int) -> torch.Tensor:
            return (1.0 + 0.1 * torch.randn(d, generator=g, dtype=torch.float32)).to(self.device)

        H, nh, hd = c.hidden_size, c.num_heads, c.head_dim
        self.embedding = w(c.vocab_size, H, fan_in=1)  # [vocab, H]
        self.layers: list[dict[str, torch.Tensor]] = []
        for _ in range(c.num_layers):
            p = {"attn_norm": norm_w(H), "mlp_norm": norm_w(H), "w_o": w(nh * hd, H),
                 "w_gate": w(H, c.mlp_size), "w_up": w(H, c.mlp_size), "w_down": w(c.mlp_size, H)}  # fmt: skip
            if c.kv_mode == "mla":
                R, D = c.rope_dim, c.kv_lora_rank
                p.update(w_dkv=w(H, D), kv_norm=norm_w(D), w_kr=w(H, R), w_q_lat=w(H, nh * D),
                         w_q_rope=w(H, nh * R), w_uv=w(nh, D, hd, fan_in=D))  # fmt: skip
            else:
                p.update(w_q=w(H, nh * hd), w_k=w(H, nh * hd), w_v=w(H, nh * hd))
            self.layers.append(p)
        self.final_norm_w = norm_w(H)

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
            D, R = c.kv_lora_rank, c.rope_dim
            q_lat = (x @ p["w_q_lat"]).view(n, nh, D)
            q_rope = rotary((x @ p["w_q_rope"]).view(n, nh, R), positions, c.rope_theta)
            q = torch.cat((q_lat, q_rope), dim=-1)  # [n, nh, D+R]
            scores = torch.einsum("qhw,kw->hqk", q, rows) / (D + R) ** 0.5
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

    def weights_digest(self) -> float:
        """Sum of all weights as a float64 checksum (equal in every process built from the same seed)."""
        tensors = [self.embedding, self.final_norm_w] + [t for p in self.layers for t in p.values()]
        return float(sum(t.double().sum().item() for t in tensors))

    # ------------------------------------------------------------------------------------- reference
    def reference_forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Single-process reference: final hidden states ``[T, hidden]`` of one whole sequence ``[T]``.

        Plain causal attention over the full sequence (positions ``0..T-1``), no KV cache, no pages,
        no plan: what every CP forward of the same request must reproduce, position by position.
        """
        ids = torch.as_tensor(token_ids, dtype=torch.int64, device=self.device)
        pos = torch.arange(ids.shape[0], dtype=torch.int64, device=self.device)
        h = self.embed(ids)
        for layer in range(self.config.num_layers):
            x = self.attn_input(layer, h)
            h = h + self.attention(layer, x, pos, self.kv_rows(layer, x, pos), pos)
            h = h + self.mlp(layer, h)
        return self.final_norm(h)


def _causal_softmax(scores: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores [h, q, k]`` over keys with ``k_pos <= q_pos`` (others get probability 0)."""
    masked = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.softmax(masked, dim=-1)
