#!/usr/bin/env bash
# The main job on the embedded default: set up .venv, train yamls/quickstart.yaml on the
# embedded corpus, evaluate past the training length, print a summary table.
# Extra arguments are config overrides, e.g. `bash tools/quickstart.sh train.max_steps=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/fsf run yamls/quickstart.yaml "$@"
