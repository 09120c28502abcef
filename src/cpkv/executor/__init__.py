"""Distributed reference executor: real context-parallel prefill of a tiny decoder on C processes.

Proves end to end that the owner plans, the rank-major layout and the gather index are right: C ranks
(gloo on CPU, NCCL when every rank has a GPU) run CP prefill over one shared paged KV buffer, each writing
only its own lane, and the gathered final hidden states equal a single-process reference.

Entry points: ``run_dist(cases, cp_size)`` (spawns the ranks), ``python -m cpkv.executor`` under torchrun,
``cpkv run-dist`` (see ``cli_entry.run_dist_command``). See docs/distributed.md.
"""

from .case import CaseResult, DistCase, ForwardRecord, run_case, run_cases
from .errors import (
    DistError,
    InjectedFault,
    LaneWriteError,
    LaunchError,
    RankOrderError,
    RemoteRankError,
    ReplicaDivergence,
)
from .forward import CPExecutor, ForwardOutput, WriteAudit
from .group import RankGroup, check_rank_order
from .kv_buffer import KVBuffer, create_kv_buffer
from .launch import DistRun, RankOutcome, run_dist, run_rank, spawn_ranks
from .model import TinyDecoder, TinyDecoderConfig
from .scheduler import ForwardBatch, ReplicatedScheduler
from .workload import Workload, make_workload

__all__ = [
    "CPExecutor",
    "CaseResult",
    "DistCase",
    "DistError",
    "DistRun",
    "ForwardBatch",
    "ForwardOutput",
    "ForwardRecord",
    "InjectedFault",
    "KVBuffer",
    "LaneWriteError",
    "LaunchError",
    "RankGroup",
    "RankOrderError",
    "RankOutcome",
    "RemoteRankError",
    "ReplicaDivergence",
    "ReplicatedScheduler",
    "TinyDecoder",
    "TinyDecoderConfig",
    "Workload",
    "WriteAudit",
    "check_rank_order",
    "create_kv_buffer",
    "make_workload",
    "run_case",
    "run_cases",
    "run_dist",
    "run_rank",
    "spawn_ranks",
]
