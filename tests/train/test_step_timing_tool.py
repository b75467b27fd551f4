"""`tools/step_timing.py`, the step timer of bench_loss, bench_rewired and bench_compile, used as they use it:
a script runs itself again in a fresh process with its own arguments and `--worker ...`
(`in_fresh_process`), the worker times a step with `time_steps` and prints the JSON the script reads; a
failing worker is named by its label, with its error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.utils import REPO

SCRIPT = f"""import json, sys
sys.path.insert(0, {str(REPO / "tools")!r})
from step_timing import in_fresh_process, time_steps

if "--worker" in sys.argv:
    mib, = sys.argv[sys.argv.index("--worker") + 1:]
    if mib == "fail":
        raise SystemExit("the worker broke")
    import torch

    kept, calls = [], []

    def step():  # each call keeps a new tensor of MIB MiB, touched
        calls.append(1)
        kept.append(torch.ones(int(mib) * 2**18))

    print("worker output before its result")
    print(json.dumps({{**time_steps(step, 2, cuda=False), "calls": len(calls), "argv": sys.argv[1:]}}))
else:
    print(json.dumps(in_fresh_process(__file__, ["16"], "a 16 MiB step")))
    try:
        in_fresh_process(__file__, ["fail"], "a failing step")
    except RuntimeError as err:
        print(json.dumps(str(err)))
"""


def test_time_steps_in_a_fresh_process(tmp_path):
    script = tmp_path / "bench_something.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), "--size", "3"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    measured, failed = (json.loads(line) for line in proc.stdout.splitlines())
    assert measured["calls"] == 3  # a warm-up, then `repeats`
    assert measured["argv"] == ["--size", "3", "--worker", "16"]  # the script's own arguments, then the worker's
    assert measured["time_s"] > 0 and measured["first_s"] > 0
    assert measured["peak_bytes"] >= 3 * 16 * 2**20  # the RSS growth from before the warm-up: three steps' tensors
    assert failed.startswith("a failing step failed:") and "the worker broke" in failed
