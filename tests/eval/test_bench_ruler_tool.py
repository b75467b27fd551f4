"""`tools/bench_ruler.py` runs end to end at a toy size: random weights of the quickstart job
shrunk by overrides, two tasks at one length, its rows written as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.utils import REPO


def test_bench_ruler_times_each_part_of_each_task(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "tools/bench_ruler.py", "--lengths", "512", "--samples", "1",
                           "--tasks", "vt,fwe,cwe", "--json", str(out), "model.n_layers=1", "model.d_model=32",
                           "model.n_heads=2"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [r["task"] for r in rows] == ["vt", "fwe"]  # cwe cannot fit at 512 bytes: skipped, with its reason
    assert "cwe" in proc.stdout and "skipped" in proc.stdout
    for row in rows:
        assert row["prefill_s"] > 0 and row["decode_s"] >= 0 and row["slowest"] in ("prompts", "prefill", "decode")
        assert row["per_task_s"] == row["per_sample_s"] * 100
    assert "suite at 512: 2 tasks x 100 samples" in proc.stdout
