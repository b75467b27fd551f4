#!/usr/bin/env bash
# Set up .venv and run the whole test suite on the CPU (Triton kernels under the interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m pytest -q --timeout=900 "$@"
