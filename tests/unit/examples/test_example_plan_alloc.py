"""``examples/plan_alloc.py`` runs and prints the README's 30-second example values (SPEC C-HEAD, C-ALLOC).

The request plan is SPEC's worked example (C=4, P=64, L0=100, E=200, head owner 1); the allocation of a
fresh 1,000-token prompt is the README's (16 pages, zigzag over 4 lanes, lowest ids first), and its first
slots are page 4's first rows (page 4 is on lane 4 % 4 = 0, the rank that computes the first tokens).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import oracle

pytestmark = [pytest.mark.unit, pytest.mark.clause("C-HEAD"), pytest.mark.clause("C-ALLOC")]

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "plan_alloc.py"


def test_plan_alloc_example_prints_the_readme_values():
    env = {k: v for k, v in os.environ.items() if k not in ("CPKV_OWNER_POLICY", "CPKV_KERNELS")}
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "phase 1 page owners [1, 2, 3] tokens per rank [0, 92, 64, 44]"
    assert lines[1] == f"logits elements per rank {[0, 92 * 192, 64 * 256, 44 * 300]}"  # C-ESTIMATE by hand
    # 16 pages = 2 x 2C: every phase puts 4 on each lane, so C-BALANCED keeps the rotation phase, 0.
    owners = oracle.plan_request(0, 1000, 4, 64, 0)["page_owners"]
    pages = oracle.fresh_alloc_pages(owners, 4, 8)
    assert pages == [4, 8, 1, 5, 2, 6, 3, 7, 11, 15, 10, 14, 9, 13, 12, 16]
    assert lines[2] == f"new pages {pages}"
    assert lines[3] == f"first slots {[pages[0] * 64 + o for o in range(3)]} on lane 0"
    assert lines[5] == "free pages per lane [3, 4, 4, 4]" and lines[6] == "after free [7, 8, 8, 8]"
