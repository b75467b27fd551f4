"""`tools/bench_decode.py` runs end to end at a toy size (docs/decoding.md): from a job YAML, and from
`--d-model` alone with neither the YAML reader nor DeepSpeed importable, as on a GPU machine that has
only torch and triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.utils import REPO

# the tool in a process where omegaconf and deepspeed cannot be imported
WITHOUT_YAML = ("import runpy, sys; sys.modules['omegaconf'] = None; sys.modules['deepspeed'] = None; "
                "sys.argv = ['bench_decode.py', *sys.argv[1:]]; sys.path.insert(0, 'tools'); "
                "runpy.run_path('tools/bench_decode.py', run_name='__main__')")


def _run(tmp_path, *args: str, without_yaml: bool = False) -> list[dict]:
    out = tmp_path / "rows.json"
    command = [sys.executable, "-c", WITHOUT_YAML] if without_yaml else [sys.executable, "tools/bench_decode.py"]
    proc = subprocess.run([*command, *args, "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_from_a_model_size_without_the_yaml_reader(tmp_path):
    rows = _run(tmp_path, "--models", "fsl", "swa", "--contexts", "300", "--new-tokens", "3", "--d-model", "64",
                "--layers", "2", "--heads", "4", "--count-ops", without_yaml=True)
    assert [(r["model"], r["context"]) for r in rows] == [("fsl", 300), ("swa", 300)]
    for row in rows:
        assert row["tokens_per_s"] > 0 and row["cache_bytes"] > 0 and row["ops_per_token"] > 0
        assert 0 < row["launches_per_token"] < row["ops_per_token"]  # views launch nothing
    assert rows[0]["ops_per_token"] > rows[1]["ops_per_token"]  # FS-L routes and reads cells besides its window


def test_from_a_job_yaml_with_overrides(tmp_path):
    rows = _run(tmp_path, "--models", "fs", "--contexts", "200", "--new-tokens", "2", "model.n_layers=1")
    assert len(rows) == 1 and rows[0]["model"] == "fs" and "ops_per_token" not in rows[0]


def test_impls_side_by_side(tmp_path):
    """`--impls`: each model under each implementation, the same weights (FS-B, calibrated on them)."""
    rows = _run(tmp_path, "--models", "fsb", "--impls", "reference", "auto", "--contexts", "200", "--new-tokens", "2",
                "--d-model", "32", "--layers", "1", "--heads", "2", "--count-ops")
    assert [(r["model"], r["impl"]) for r in rows] == [("fsb", "reference"), ("fsb", "auto")]
    assert rows[0]["cache_bytes"] == rows[1]["cache_bytes"]
    assert rows[0]["ops_per_token"] == rows[1]["ops_per_token"]  # on the CPU "auto" runs the same PyTorch ops
