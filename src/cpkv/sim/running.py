"""The simulator's record of one admitted request: prompt, ``req_to_token`` row and progress."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache.flow import RequestKV
from .trace import Request


@dataclass(eq=False)
class RunningRequest:
    """A request admitted to the group: its prompt, its KV (``cache.flow.RequestKV``: the ``req_to_token``
    row, the lock on its cached prefix, its own pages, and ``kv.length``, the positions whose KV exists:
    cached prefix + computed, then the output positions decoded) and its decode progress (tokens).

    ``decoded`` counts its output positions with KV (0 while it prefills). A request a retraction dropped
    while decoding comes back with ``redo`` emitted tokens to prefill after its prompt (their KV was freed),
    then decodes the rest.
    """

    req: Request
    token_ids: np.ndarray  # [input_length] int64
    kv: RequestKV
    decoded: int = 0
    redo: int = 0  # output tokens whose KV a retraction dropped: prefilled again after the prompt

    @property
    def slots(self) -> np.ndarray:
        """``[input_length + output_length]`` int64 ``req_to_token`` row; ``[:kv.length]`` is set."""
        return self.kv.slots

    @property
    def remaining(self) -> int:
        """Tokens it still prefills (its prompt and ``redo``), while it prefills."""
        return self.req.input_length + self.redo - self.kv.length
