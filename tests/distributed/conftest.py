"""One spawned gloo group per C in {1, 2, 3, 4} runs the whole case matrix (``matrix.cases_for``); the
equivalence, NSA and local-access test modules share it (session scope), so each C pays for one spawn."""

import pytest
from matrix import cases_for

from cpkv.executor import run_dist


@pytest.fixture(scope="session", params=[1, 2, 3, 4], ids=lambda c: f"C{c}")
def run(request):
    """``(C, DistRun)``: every case of ``cases_for(C)`` run by C ranks; ``.results`` is rank 0's list."""
    C = request.param
    return C, run_dist(cases_for(C), C, backend="gloo", timeout_s=60, deadline_s=400)
