#!/usr/bin/env bash
# One prepared GPU check for the fsf_kernels Triton kernels (about 10 minutes on one H200):
#   1. the GPU-marked kernel tests (bf16/fp16 and large shapes), if pytest is installed;
#   2. tools/bench_kernels.py (its own correctness pass, then timings per size).
# Needs only torch and triton: the repository is put on PYTHONPATH, nothing is installed.
# Usage: tools/gpu_check.sh [extra bench_kernels.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
status=0

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null || echo "nvidia-smi unavailable"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())" \
  || { echo "gpu_check: torch/triton do not import"; exit 1; }

if "$PY" -c "import pytest" 2>/dev/null; then
  echo "== GPU kernel tests"
  timeout 240 "$PY" -m pytest -q -m gpu tests/kernels -p no:cacheprovider -x --durations=10 || status=$?
  [ "$status" -eq 124 ] && echo "gpu_check: tests timed out after 240s"
else
  echo "== pytest is not installed: skipping the GPU tests (bench_kernels.py still checks correctness)"
fi

echo "== benchmark"
timeout 330 "$PY" tools/bench_kernels.py --budget-s 240 "$@"
bench=$?
[ "$bench" -eq 124 ] && echo "gpu_check: benchmark timed out after 330s (partial results above)"
[ "$bench" -ne 0 ] && status=$bench
exit "$status"
