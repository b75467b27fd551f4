"""`tools/bench_fsb.py` runs its cost table end to end at a toy size for the cases asked (on a GPU
machine `fsb-torch` against `fsb` compares the search in PyTorch with its kernel: tools/gpu_check.sh
step 9)."""

from __future__ import annotations

import subprocess
import sys

from tests.utils import REPO


def test_cost_table_for_the_chosen_cases():
    proc = subprocess.run([sys.executable, "tools/bench_fsb.py", "--cases", "fsb-torch", "fs", "--lengths", "256",
                           "--heads", "1", "--head-dim", "16", "--skip-recall"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("wall time (s)")[1].split("CPU time")[0]
    assert [line.split()[0] for line in table.strip().splitlines()[2:]] == ["fsb-torch", "fs"]
    ops = proc.stdout.split("aten ops per query block")[1]
    rows = {line.split()[0]: line.split()[1:] for line in ops.strip().splitlines()[3:]}
    assert set(rows) == {"fsb-torch", "fs"} and float(rows["fsb-torch"][0]) > 0  # one length: no exponent
