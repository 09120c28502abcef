"""KV storage designs of a CP group, side by side on one trace (SPEC C-STORAGE; docs/storage-models.md).

``build_storage(name, config, policy, cost)`` builds one design for one replay; ``KVStorage`` (``base.py``)
is the interface the engine drives. The designs, one per file:

- ``owner_lane.py``: ``owner-lane`` (cpkv): pages on the computing rank's lane, no KV all-gather;
- ``replicated.py``: ``replicated`` (SGLang in-seq-split CP up to 0.5.9): every rank stores every page;
- ``interleaved.py``: ``interleaved`` (SGLang 0.5.23 page interleave): position-page j on rank (b + j) % C;
- ``vblock.py``: ``interleaved-vblock`` (vLLM DCP): virtual blocks of P * C tokens, one page per rank.

Shared parts: ``allocator.py`` and ``one_pool.py`` (the allocators the scheduler drives when storage is not
compute), ``compute.py`` (the compute plan of the group's CP split), ``traffic.py`` (what each step moves, priced) and
``recompute.py`` (``prefill_tokens_recomputed``).
"""

from __future__ import annotations

from ...validate import check_name
from ..config import KV_STORAGE_DESIGNS, OWNER_LANE, SimConfig
from .base import KVStorage
from .interleaved import InterleavedStorage
from .owner_lane import OwnerLaneStorage
from .replicated import ReplicatedStorage
from .vblock import VirtualBlockStorage

__all__ = ["KV_STORAGE_DESIGNS", "OWNER_LANE", "KVStorage", "build_storage"]

_DESIGNS = {d.name: d for d in (OwnerLaneStorage, ReplicatedStorage, InterleavedStorage, VirtualBlockStorage)}


def build_storage(name: str, config: SimConfig, policy: str, cost) -> KVStorage:
    """The design ``name`` for one replay of ``config``: its allocator, prefix cache and traffic counters.

    ``policy`` is the owner policy (it places owner-lane's pages; the other designs have their own
    placement); ``cost`` the run's ``StepCost`` (it prices the traffic). ConfigError for an unknown name.
    """
    return _DESIGNS[check_name(name, KV_STORAGE_DESIGNS, "kv storage")](config, policy, cost)
