"""benchmarks/bench_kernels.py without a GPU: says "no CUDA device", writes its JSON, exits 0."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the benchmark measures: run it by hand"),
]

ROOT = Path(__file__).resolve().parents[3]


def test_bench_kernels_exits_cleanly_without_cuda(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")  # the benchmark never runs the interpreter
    figures = tmp_path / "figures.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--quick", "--json", str(figures)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("no CUDA device")
    payload = json.loads(figures.read_text())
    assert payload["cuda"] is False and payload["cases"] == {} and payload["quick"] is True
