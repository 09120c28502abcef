#!/usr/bin/env bash
# The GPU checks of cpkv, as one script for a machine with a CUDA device (SPEC C-KERNEL):
# the compiled Triton kernels against the numpy reference (tests/kernels), then benchmarks/bench_kernels.py.
#     bash benchmarks/gpu_check.sh [OUTDIR]     (logs and bench_kernels.json go to OUTDIR, default gpu-out/)
# Uses the python3 on PATH with torch, triton, numpy, click, rich, msgspec, hypothesis, pytest, pytest-timeout.
set -uo pipefail
out=${1:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$out/env.txt"
rc=0
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels --timeout 280 --durations=8 2>&1 | tee "$out/pytest_kernels.log" || rc=1
timeout 200 python3 benchmarks/bench_kernels.py --json "$out/bench_kernels.json" 2>&1 | tee "$out/bench_kernels.log" || rc=1
exit $rc
