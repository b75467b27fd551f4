#!/usr/bin/env bash
# The main job on the embedded default: set up .venv, train yamls/quickstart.yaml on the
# embedded corpus and evaluate its perplexity past the training length; then train the same
# kind of model (FS) on associative recall (yamls/mqar-cpu.yaml: the induction warm-up, then
# 8 pairs a row; shortened) and score its recall at 1x-4x the training length, beyond the reach
# of its stacked local windows, against the floor of a model that knows the row's values only.
# Extra arguments are config overrides of the text job, e.g. `bash tools/quickstart.sh train.max_steps=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
.venv/bin/fsf run yamls/quickstart.yaml "$@"
exec .venv/bin/fsf run yamls/mqar-cpu.yaml run_dir=runs/quickstart-mqar train.max_steps="${FSF_MQAR_STEPS:-2000}" \
    "eval.lengths=[128,256,512]"
