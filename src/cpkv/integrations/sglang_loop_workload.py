"""The engine loop's workload, configuration and results (``cpkv.integrations.sglang_engine_loop``).

The first requests of a Mooncake trace with each 512-token block scaled down (``scaled_prompts``), the known
K/V rows the replaced model forward writes (``kv_rows``), the loop's configuration (``LoopConfig``) and what
it counts (``LoopStats``). Imports no SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..sim.trace import TRACE_BLOCK_TOKENS, Request, load_trace, prompt_token_ids

HEAD_DIM = 4
"""K/V row width: the token id in three 12-bit parts and the position, exact in float32."""


def kv_rows(
    tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The known K/V rows of tokens at positions computed on lanes (int64 ``[n]`` each): float32 ``[n, 1, 4]``
    each, K = ``(id & 0xFFF, id >> 12 & 0xFFF, id >> 24, position)``, V = ``(K[:3], lane) + 0.5``. Every value
    < 2**24: exact. A page's rows keep the lane that computed them through HiCache and L3, so a page loaded
    back onto another lane no longer matches the rows expected at its slot."""
    t = tokens.to(torch.int64)
    k = torch.stack([t & 0xFFF, (t >> 12) & 0xFFF, t >> 24, positions.to(torch.int64)], dim=1).float()
    v = torch.cat([k[:, :3], lanes.to(torch.float32)[:, None]], dim=1) + 0.5
    return k[:, None, :], v[:, None, :]


def scaled_prompts(path, requests: int, block_tokens: int) -> list[np.ndarray]:
    """Token ids of the first ``requests`` prompts of a Mooncake trace with each 512-token block scaled to
    ``block_tokens`` tokens (``input_length`` scaled by ``block_tokens / 512``, rounded up), so equal
    ``hash_ids`` prefixes still give equal token prefixes; int64 ``[len]`` each."""
    out = []
    for r in load_trace(path, max_requests=requests):
        n = -(-r.input_length * block_tokens // TRACE_BLOCK_TOKENS)
        scaled = Request(r.req_id, r.arrival_ms, n, r.output_length, r.hash_ids)
        out.append(prompt_token_ids(scaled, block_size=block_tokens))
    return out


@dataclass
class LoopConfig:
    """One engine loop: the group, the pools and the trace scaling.

    Attributes:
        allocator: ``"cpkv"`` (through SGLang's platform hook) or ``"sglang"`` (PageInterleavePoolAllocator).
        cp_size, page_size: C and P. rank_pages: pages of one rank's pool (``size = rank_pages * P``).
        owner_policy: cpkv's policy (``CPKV_OWNER_POLICY``). host_ratio: HiCache host pool / device pool.
        storage_dir: the L3 ``file`` backend's directory, or None for no L3.
        block_tokens: tokens of one trace block (512 in the trace). arrivals: requests arriving a step.
        max_prefill_tokens: the PrefillAdder's ``rem_input_tokens`` a step. max_requests: request slots.
    """

    allocator: str = "cpkv"
    cp_size: int = 4
    page_size: int = 4
    rank_pages: int = 96
    owner_policy: str = "balanced"
    host_ratio: float = 2.0
    storage_dir: str | None = None
    block_tokens: int = 4
    arrivals: int = 4
    max_prefill_tokens: int = 1024
    max_requests: int = 32


@dataclass
class LoopStats:
    """What the loop counted (tokens or pages, as named); ``lane_peak`` is the most pages held on one lane at
    any step end, ``imbalance_peak`` the largest ``max / mean`` of the lanes' held pages at a step end."""

    steps: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    storage_hit_tokens: int = 0
    computed_tokens: int = 0
    load_back_pages: int = 0
    load_back_off_lane_pages: int = 0
    pages_recomputed: int = 0
    lane_peak: int = 0
    imbalance_peak: float = 1.0
    checked_pages: int = 0
    invariant_checks: int = 0

    @property
    def cache_hit_tokens(self) -> int:
        """Prompt tokens not computed: device + host + L3 hits."""
        return self.device_hit_tokens + self.host_hit_tokens + self.storage_hit_tokens


class LoopCheckError(AssertionError):
    """A check of ``EngineLoop.checks`` failed; the message names the step and the value."""
