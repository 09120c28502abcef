"""Typed errors of the distributed reference executor (``cpkv.executor``).

Errors a rank raises on its own (``LaneExhausted``, ``PlanError``, ...) are not wrapped: every rank of the
group raises the same typed error (see ``RankGroup.agree``). The classes here are for what only a group
of processes can get wrong: rank order, replicas that drift apart, a write outside the own lane, an
error that cannot be shipped to the peers, a launch that does not finish.
"""

from __future__ import annotations

from ..errors import CpkvError


class DistError(CpkvError, RuntimeError):
    """Base class of the distributed executor's own errors."""


class RankOrderError(DistError):
    """The start-up self-check found slot i of an all-gather not holding rank i.

    The rank-major KV view and the gather-back (SPEC C-GATHER) both assume that collectives concatenate
    in rank order; a group that does not is refused before any KV is written.
    """


class ReplicaDivergence(DistError):
    """Ranks disagree on replicated scheduler state (allocator ``state_digest()``, slots, token ids).

    Every rank replays the same allocator calls; a digest mismatch means the replicas drifted, and the
    pages a rank writes would not be the pages its peers read.
    """


class LaneWriteError(DistError):
    """A rank was asked to write a slot outside its own lane (SPEC C-LAYOUT, C-OWNER-EQ-COMPUTE)."""


class LaneReadError(DistError):
    """Under ``kv_access = local`` a rank was asked to read a slot of another lane (SPEC C-MERGE)."""


class RemoteRankError(DistError):
    """Stand-in for an error of another rank that could not be pickled; names the rank and the error.

    Attributes: ``rank`` (int, the failing rank), ``where`` (str, the step), ``error`` (str, its repr).
    """

    def __init__(self, rank: int, where: str, error: str) -> None:
        self.rank, self.where, self.error = int(rank), str(where), str(error)
        super().__init__(f"rank {self.rank} failed during {self.where}: {self.error}")

    def __reduce__(self):
        return (type(self), (self.rank, self.where, self.error))


class LaunchError(DistError):
    """A spawned rank did not report within the time limit or died without a result.

    The launcher kills every straggler before raising, so nothing keeps running.
    """


class InjectedFault(DistError):
    """Raised on purpose by one rank (``DistCase.fault_rank``) to test that every rank fails alike."""

    def __init__(self, rank: int, where: str) -> None:
        self.rank, self.where = int(rank), str(where)
        super().__init__(f"injected fault on rank {self.rank} during {self.where}")

    def __reduce__(self):
        return (type(self), (self.rank, self.where))
