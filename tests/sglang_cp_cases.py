"""Shared by the differential tests of ``cpkv.integrations.sglang_cp`` against SGLang 0.5.23
(tests/integration/sglang/) and 0.5.9 (tests/integration/sglang059/): random batches, field comparison,
an in-process stand-in for the CP group's all-gather, SGLang's strategies on a given rank and the page_size 1
round-robin plan. Imports neither sglang nor cpkv's builders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from cpkv import CPConfig, plan_batch

PAGE_SIZES = (2, 4, 16, 64)


def on_rank(strategy_cls: type, cp_size: int, rank: int):
    """An instance of SGLang's CP strategy class ``strategy_cls`` (zigzag, interleave) whose ``cp_rank`` is
    ``rank`` (SGLang's reads the runtime context)."""
    ranked = type(f"Ranked{strategy_cls.__name__}", (strategy_cls,), {"cp_rank": property(lambda self: rank)})
    return ranked(cp_size=cp_size)


def round_robin_plan(case: Case):
    """``case``'s interleave plan at page_size 1 with phase ``cum_E[i] % C``: flat token t on rank ``t % C``,
    SGLang 0.5.23's default interleave split and 0.5.9's round-robin split."""
    C, E = case.cp_size, case.extend_lens
    phases = (np.cumsum([0, *E])[:-1] % C).tolist()
    return plan_batch(case.prefix_lens, E, CPConfig(C, 1, "rotation", "interleave"), phases=phases)


@dataclass(frozen=True)
class Case:
    """One random batch: C ranks, P tokens a page, per request a page-aligned prefix and an extend."""

    cp_size: int
    page_size: int
    prefix_lens: list[int]
    extend_lens: list[int]

    def __str__(self) -> str:
        return f"C={self.cp_size} P={self.page_size} L0={self.prefix_lens} E={self.extend_lens}"


def random_case(rng: np.random.Generator, *, page_size: int = 1, max_bs: int = 4, max_cp: int = 8) -> Case:
    """A batch of 1..max_bs requests whose prefixes end on a page boundary (no head tokens). Extends are
    drawn around the CP sizes where the split changes shape: below 2C (empty blocks), a few pages a block,
    and long ones; one in eight is empty."""
    C = int(rng.integers(1, max_cp + 1))
    B = int(rng.integers(1, max_bs + 1))
    P = page_size
    prefix = (rng.integers(0, 40, B) * P * (rng.random(B) < 0.6)).tolist()
    scale = rng.choice([2 * C, 8 * C * P, 64 * C * P], B)
    extend = [0 if rng.random() < 0.125 else int(rng.integers(1, s + 1)) for s in scale.tolist()]
    return Case(C, P, [int(x) for x in prefix], extend)


def assert_same(ours, theirs, what: str) -> None:
    """Byte-for-byte equality: the same Python type and value, or tensors of one dtype, device and shape
    holding equal values; lists element by element with their element types."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{what}: {type(ours).__name__}, SGLang's is a tensor"
        kind, their_kind = (
            (ours.dtype, ours.device, list(ours.shape)),
            (theirs.dtype, theirs.device, list(theirs.shape)),
        )
        assert kind == their_kind, f"{what}: {kind} vs SGLang's {their_kind}"
        assert torch.equal(ours, theirs), f"{what}: {ours.tolist()} vs SGLang's {theirs.tolist()}"
        return
    assert type(ours) is type(theirs), f"{what}: {type(ours).__name__} vs SGLang's {type(theirs).__name__}"
    if isinstance(theirs, list):
        assert [type(x) for x in ours] == [type(x) for x in theirs], f"{what}: element types differ"
    assert ours == theirs, f"{what}: {ours} vs SGLang's {theirs}"


def assert_all_fields_same(ours, theirs, case, rank: int) -> None:
    """Every dataclass field of SGLang's metadata ``theirs`` equal in ``ours`` (``assert_same``), and ours
    has exactly SGLang's fields plus ``request_phases``, in SGLang's order."""
    names = [f.name for f in dataclasses.fields(theirs)]
    assert [f.name for f in dataclasses.fields(ours)] == [*names, "request_phases"]
    for name in names:
        assert_same(getattr(ours, name), getattr(theirs, name), f"{case} rank {rank}: {name}")


class FakeCPGroup:
    """The CP group's all-gather in one process: ``shards[r]`` is rank r's local rows; a call made for
    ``rank`` must pass that rank's rows zero-padded to the output's share, as an all-gather into one tensor
    requires every rank's input to be ``output rows / C`` rows (ValueError otherwise, before any copy)."""

    def __init__(self, shards: list[torch.Tensor], rank: int) -> None:
        self.shards, self.rank = shards, rank

    def all_gather_into_tensor(self, out: torch.Tensor, x: torch.Tensor) -> None:
        C = len(self.shards)
        if out.shape[0] != C * x.shape[0]:
            raise ValueError(
                f"all_gather_into_tensor: output of {out.shape[0]} rows for {C} inputs of {x.shape[0]}"
            )
        rows = x.shape[0]
        for r, shard in enumerate(self.shards):
            if shard.shape[0] > rows:
                raise ValueError(
                    f"all_gather_into_tensor: rank {r} holds {shard.shape[0]} rows, inputs have {rows}"
                )
            padded = torch.cat([shard, shard.new_zeros(rows - shard.shape[0], *shard.shape[1:])])
            if r == self.rank:
                assert torch.equal(padded, x), "the calling rank passed other rows than its shard"
            out[r * rows : (r + 1) * rows] = padded

    def cp_all_gather_into_tensor_async(self, out: torch.Tensor, x: torch.Tensor, stream=None) -> None:
        """SGLang 0.5.9's name for the same collective."""
        self.all_gather_into_tensor(out, x)


def all_gather_buffer(shards: list[torch.Tensor], rows: int) -> torch.Tensor:
    """The all-gather buffer of C ranks' shards, each zero-padded to ``rows``: ``[C * rows, ...]``."""
    return torch.cat([torch.cat([s, s.new_zeros(rows - s.shape[0], *s.shape[1:])]) for s in shards])
