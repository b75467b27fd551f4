#!/usr/bin/env bash
# Set up .venv and run the whole test suite on the CPU (Triton kernels under the interpreter):
# one pytest-xdist worker per core, the multi-rank tests on one worker one at a time (the `ranks`
# marker), and the 20 slowest tests listed at the end, so a test that grows slow is seen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# The repository's own bytecode, written once: where PYTHONDONTWRITEBYTECODE is set, each of the
# suite's ~100 Python processes would otherwise compile the package again (~0.2 s each).
.venv/bin/python -m compileall -q -j 0 fsframework kernels tests tools > /dev/null
exec .venv/bin/python -m pytest -q --timeout=900 -n "${FSF_TEST_WORKERS:-auto}" --dist loadgroup --durations=20 "$@"
