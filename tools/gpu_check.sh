#!/usr/bin/env bash
# One prepared GPU check for the fsf_kernels Triton kernels, within 10 minutes on one H200
# (about 8 in practice):
#   1. the toolchain: versions, the GPU, one tiny kernel compiled and launched (as `fsf info`)  <= 60 s
#   2. tests/kernels on the GPU, if pytest is installed: the GPU-marked tests (bf16/fp16, large
#      shapes) and every test that takes the `device` fixture, which is CUDA there      <= 180 s
#   3. tools/bench_kernels.py: its own correctness pass, then timings per size               <= 170 s
#   4. tools/bench_rewired.py and tools/bench_scan.py on the GPU: the rewired and GRC kernels
#      inside whole models (training steps; forward passes against Transformers)       <= 2 x 80 s
#   5. tools/profile_kernels.py: device time, host time and syncs of each call and step   <= 150 s
#   6. tools/bench_loss.py on the GPU: a training step with the output head in chunks      <= 120 s
#   7. tools/bench_compile.py on the GPU: a training step with compiled blocks vs eager     <= 150 s
#   8. tools/bench_decode.py on the GPU: cached decoding (host-bound at batch 1?), prefill    <= 120 s
#   9. FS-B side by side: cached decoding with every op in PyTorch against the kernels, then
#      whole-sequence routing with the search in PyTorch against its kernel (bench_fsb.py)   <= 120 s
# Every step's output goes to the results folder (the first argument, else $OUT, else
# ./gpu_check_results): env.txt, launch.txt, tests.txt + tests.xml (JUnit), bench.txt, rewired.txt, scan.txt,
# profile.txt, loss.txt, compile.txt, decode.txt, fsb.txt, summary.txt.
# Needs only torch and triton (and pytest for step 2): the repository is put on PYTHONPATH, nothing
# is installed. Without the training stack (omegaconf, streaming, deepspeed) the tests that train
# through `fsf` are left out and the suite's top conftest (which sets up data) is not loaded.
# Usage: tools/gpu_check.sh [RESULTS_DIR] [extra bench_kernels.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${1:-${OUT:-$PWD/gpu_check_results}}"
[ $# -gt 0 ] && shift
mkdir -p "$RESULTS"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONPATH="$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
status=0
started=$(date +%s)
note() { echo "$*" | tee -a "$RESULTS/summary.txt"; }

{
  date -u
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv 2>/dev/null || echo "nvidia-smi unavailable"
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$RESULTS/env.txt"
"$PY" -c "import torch, triton" 2>/dev/null || { note "gpu_check: torch/triton do not import"; exit 1; }

# step LABEL SECONDS FILE COMMAND...: COMMAND under a time limit, its output on the screen and in
# RESULTS/FILE; a failure or timeout is noted and becomes the check's exit status
step() {
  local label=$1 seconds=$2 file=$3 rc
  shift 3
  timeout "$seconds" "$@" 2>&1 | tee "$RESULTS/$file"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && note "gpu_check: $label timed out after ${seconds}s (partial output in $file)"
  note "$label: exit $rc"
  [ "$rc" -ne 0 ] && status=$rc
  return 0
}

echo "== one tiny kernel, compiled and launched"
step "launch check" 60 launch.txt "$PY" -c "from fsframework.ops.launch_check import kernel_launch_check; \
r = kernel_launch_check(); print(r); raise SystemExit(not r.startswith('yes'))"

if "$PY" -c "import pytest" 2>/dev/null; then
  echo "== kernel tests on the GPU"
  # test_compile_targets compiles for GPU targets on a CPU host (ptxas only, minutes of CPU): a GPU
  # runs the kernels themselves instead
  args=(-q tests/kernels -p no:cacheprovider --confcutdir=tests/kernels --durations=15
        --ignore=tests/kernels/test_compile_targets.py --junitxml="$RESULTS/tests.xml")
  # several workers compile Triton's variants side by side (the GPU holds them all easily)
  "$PY" -c "import xdist" 2>/dev/null && args+=(-n "${GPU_CHECK_WORKERS:-8}")
  if ! "$PY" -c "import omegaconf, streaming, deepspeed" 2>/dev/null; then
    note "the training stack is not installed: tests that train through fsf are left out"
    args+=(--ignore=tests/kernels/test_freesolo_model_triton.py)
  fi
  step "GPU tests" 180 tests.txt "$PY" -m pytest "${args[@]}"
  note "GPU tests: $(tail -n 1 "$RESULTS/tests.txt")"
else
  note "pytest is not installed: tests skipped (bench_kernels.py still checks correctness)"
fi

echo "== benchmark"
step "benchmark" 170 bench.txt "$PY" tools/bench_kernels.py --budget-s 110 "$@"
echo "== kernels inside models"
step "rewired training steps" 80 rewired.txt "$PY" tools/bench_rewired.py --device cuda --d-model 1024 \
  --layers 4 --heads 16 --lengths 1024 2048 4096 8192
step "AR-GRC scan" 80 scan.txt "$PY" tools/bench_scan.py --impl triton --device cuda --lengths 1024 4096 16384 65536
echo "== where the time goes"
step "profile" 150 profile.txt "$PY" tools/profile_kernels.py
echo "== the output head in chunks"
step "loss chunks" 120 loss.txt "$PY" tools/bench_loss.py --device cuda --batch 4 --d-model 1024 --layers 4 \
  --heads 16 --vocab 32000 128256 --lengths 4096 --chunks 0 4096 1024
echo "== compiled blocks"
step "compiled blocks" 150 compile.txt "$PY" tools/bench_compile.py --device cuda --kinds tfpp fsl --d-model 1024 \
  --layers 4 --heads 16 --vocab 32000 --length 4096 --repeats 5
echo "== cached decoding"
step "decoding" 120 decode.txt "$PY" tools/bench_decode.py --device cuda --d-model 1024 --layers 4 --heads 16 \
  --models swa fsl fs tfpp --contexts 4096 16384 --new-tokens 64
echo "== FS-B: PyTorch against the kernels (the forest search's among them)"
step "FS-B search" 120 fsb.txt bash -c "\"$PY\" tools/bench_decode.py --device cuda --d-model 1024 --layers 4 \
  --heads 16 --models fsb --impls reference auto --contexts 4096 16384 --new-tokens 32 && \"$PY\" tools/bench_fsb.py \
  --device cuda --cases fsb-torch fsb fs --lengths 16384 65536 --heads 16 --skip-recall"
note "gpu_check: exit $status after $(( $(date +%s) - started )) s; results in $RESULTS"
exit "$status"
