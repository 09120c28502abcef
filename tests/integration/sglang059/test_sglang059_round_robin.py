"""Differential test of cpkv's ``interleave`` strategy (C-INTERLEAVE) against SGLang 0.5.9's
``round-robin-split`` CP mode (``sglang/srt/layers/attention/nsa/utils.py``, the installed 0.5.9 wheel in
``.venv-sglang059``): at page_size 1 with phases ``cum_E[i] % C`` an interleave plan is that split, flat
token t on rank ``t % C``. 0.5.9 has no metadata object for this mode (``NSAContextParallelMetadata`` is the
in-seq-split's); its split is ``nsa_cp_round_robin_split_data`` and the per-request query rows
``nsa_cp_round_robin_split_q_seqs_cpu``. Stubbed: the CP rank and size (``get_attention_cp_rank`` /
``get_attention_cp_size``, read from SGLang's runtime). Seeded loop of 400 random batches.
"""

import importlib.metadata

import numpy as np
import pytest
import torch

from sglang_cp_cases import random_case, round_robin_plan

nsa = pytest.importorskip("sglang.srt.layers.attention.nsa.utils", reason="SGLang 0.5.9 (make test-sglang)")
if importlib.metadata.version("sglang") != "0.5.9":
    pytest.skip("needs SGLang 0.5.9 (.venv-sglang059)", allow_module_level=True)

pytestmark = [pytest.mark.sglang, pytest.mark.clause("C-INTERLEAVE")]


def test_round_robin_split_is_an_interleave_plan_at_page_size_1(monkeypatch):
    """Per rank: SGLang's split of the batch's rows holds exactly the rows cpkv's plan gives that rank, and
    SGLang's query rows per request (requests without rows left out, as SGLang does) are the plan's."""
    rng = np.random.default_rng(3659)
    for _ in range(400):
        case = random_case(rng, max_bs=4)
        C, E = case.cp_size, case.extend_lens
        N = sum(E)
        if N == 0:
            continue
        plan = round_robin_plan(case)
        x = torch.arange(N * 2, dtype=torch.float32).reshape(N, 2)
        monkeypatch.setattr(nsa, "get_attention_cp_size", lambda C=C: C)
        for r in range(C):
            monkeypatch.setattr(nsa, "get_attention_cp_rank", lambda r=r: r)
            mine = torch.from_numpy(np.flatnonzero(plan.token_owner == r))
            assert torch.equal(nsa.nsa_cp_round_robin_split_data(x), x[mine]), case
            q_seqs, bs_idx = nsa.nsa_cp_round_robin_split_q_seqs_cpu(list(E))
            rows = plan.per_request_rank_tokens[:, r]
            assert bs_idx == np.flatnonzero(rows).tolist() and q_seqs == rows[rows > 0].tolist(), case
