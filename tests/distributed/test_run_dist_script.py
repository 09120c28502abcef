"""``run_dist`` called from a script without ``if __name__ == "__main__":``: the
spawned ranks import the script again and die at start; the error says so at once, not "missed the
deadline" (docs/distributed.md's example, guarded, runs in tests/unit/docs/test_doc_examples.py)."""

import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

SCRIPT = """from cpkv.executor import DistCase, make_workload, run_dist
run_dist([DistCase(workload=make_workload([0], [40], chunks=2), page_size=16)], cp_size=2)
"""


def test_an_unguarded_script_names_the_missing_main_guard(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(SCRIPT)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=170)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "cpkv.executor.errors.LaunchError: ranks [0, 1] died without reporting (exit codes "
        "{0: 1, 1: 1}); every rank was stopped. A rank that dies at start:"
    ), last
    assert 'under `if __name__ == "__main__":`' in last
    assert time.monotonic() - t0 < 120  # not the default 360 s deadline
