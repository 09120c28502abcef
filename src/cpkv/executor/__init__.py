"""Distributed reference executor: real context-parallel prefill of a tiny decoder on C processes.

Proves end to end that the owner plans, the rank-major layout and the gather index are right: C ranks
(gloo on CPU, NCCL when every rank has a GPU) run CP prefill over one shared paged KV buffer, each writing
only its own lane, and the gathered final hidden states equal a single-process reference. With
``attention="nsa"`` the model is a tiny DeepSeek sparse-attention decoder (lightning indexer with an index-K
pool beside the latent pool, top-k, sparse MLA), and each rank counts the indexer logits it materialises
against ``mqa_logits_elements`` (SPEC C-NSA, C-ESTIMATE).

Entry points: ``run_dist(cases, cp_size)`` (spawns the ranks), ``python -m cpkv.executor`` under torchrun,
``cpkv run-dist`` (see ``cli_entry.run_dist_command``). See docs/distributed.md.
"""

from .case import DistCase, host_hooks, run_case, run_cases
from .decode import DecodeRecord
from .errors import (
    DistError,
    InjectedFault,
    LaneReadError,
    LaneWriteError,
    LaunchError,
    RankOrderError,
    RemoteRankError,
    ReplicaDivergence,
)
from .forward import CPExecutor, ForwardOutput, WriteAudit, gather_back
from .group import RankGroup, check_rank_order
from .kv_buffer import KVBuffer, create_kv_buffer
from .launch import DistRun, RankOutcome, run_dist, run_rank, spawn_ranks
from .model import Reference, TinyDecoder, TinyDecoderConfig
from .records import CaseResult, ForwardRecord
from .scheduler import ForwardBatch, ReplicatedScheduler
from .workload import Workload, make_workload

__all__ = [
    "CPExecutor",
    "CaseResult",
    "DecodeRecord",
    "DistCase",
    "DistError",
    "DistRun",
    "ForwardBatch",
    "ForwardOutput",
    "ForwardRecord",
    "InjectedFault",
    "KVBuffer",
    "LaneReadError",
    "LaneWriteError",
    "LaunchError",
    "RankGroup",
    "RankOrderError",
    "RankOutcome",
    "Reference",
    "RemoteRankError",
    "ReplicaDivergence",
    "ReplicatedScheduler",
    "TinyDecoder",
    "TinyDecoderConfig",
    "Workload",
    "WriteAudit",
    "check_rank_order",
    "create_kv_buffer",
    "gather_back",
    "host_hooks",
    "make_workload",
    "run_case",
    "run_cases",
    "run_dist",
    "run_rank",
    "spawn_ranks",
]
