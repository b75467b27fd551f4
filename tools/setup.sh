#!/usr/bin/env bash
# Create or reuse the virtualenv at .venv and install fsframework with its dev extras.
# torch==2.14.1 / torchvision==0.29.1 are pinned: on the project's machines that build
# installs from local disk, where any other build would download gigabytes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.fsf-installed
want=$(cat pyproject.toml tools/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "$want" > "$stamp"
