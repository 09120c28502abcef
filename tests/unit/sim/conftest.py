"""Shared helpers of the simulator tests: a log of every prefill step a ``PolicyRun`` commits, and a builder
of the KV storage designs."""

from typing import NamedTuple

import pytest

from cpkv.sim.engine import PolicyRun
from cpkv.sim.storage import build_storage


class Step(NamedTuple):
    """One committed prefill step: per request (batch order) its id, prefix and chunk (tokens) and phase;
    per rank the MQA-logits estimate (elements); per lane the free pages right after the allocation."""

    req_ids: list[int]
    prefixes: list[int]
    chunks: list[int]
    phases: list[int]
    logits: list[int]
    free_after: list[int]


@pytest.fixture
def step_log():
    """``attach(run) -> list[Step]``: the list fills as ``run.run()`` commits steps."""

    def attach(run):
        log: list[Step] = []
        commit = run.builder.commit

        def logged():
            out = commit()
            if out is not None:
                plan = out[1].plan
                log.append(
                    Step(
                        [r.req.req_id for r in out[0]],
                        plan.prefix_lens.tolist(),
                        plan.extend_lens.tolist(),
                        plan.request_phases.tolist(),
                        out[2].tolist(),
                        run.alloc.free_pages_per_lane().tolist(),
                    )
                )
            return out

        run.builder.commit = logged
        return log

    return attach


@pytest.fixture(scope="session")
def build_design():
    """``build_design(name, cfg, policy="balanced")``: the KV storage design ``name`` of ``cfg``, built as
    ``PolicyRun`` builds it (its cost model included). Session-scoped: a pure function, usable under ``@given``."""

    def build(name, cfg, policy="balanced"):
        return build_storage(name, cfg, policy, PolicyRun(cfg, policy, []).cost)

    return build
