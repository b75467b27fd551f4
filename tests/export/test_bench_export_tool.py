"""`tools/bench_export.py` end to end on the quickstart recipe, as a user runs it: a checkpoint of random
weights written through a DeepSpeed engine as the trainer writes it (ZeRO-3 here), then `fsf export`'s
wall and CPU time, model.safetensors, and the logits proof's differences (bf16: the rounding's too). The
engine starts as the trainer's does, without JIT-building DeepSpeed's CPU all-reduce extension (a minute)."""

from __future__ import annotations

import re

from tests.utils import run_tool


def test_export_of_a_zero3_checkpoint(tmp_path):
    proc = run_tool("bench_export.py", "--recipe", "yamls/quickstart.yaml", "--dtype", "bf16", "--zero-stage", "3",
                    "--workdir", str(tmp_path), timeout=120)
    assert re.search(r"yamls/quickstart.yaml: fs, [\d.]+M parameters, ZeRO stage 3", proc.stdout)
    assert "checkpoint written" in proc.stdout and "built successfully" not in proc.stdout + proc.stderr
    timed = re.search(r"export \(bf16\): ([\d.]+)s wall, ([\d.]+)s CPU; model.safetensors [\d.]+ GiB; "
                      r"largest \|logit difference\| source vs export (\S+)", proc.stdout)
    assert timed and float(timed[1]) > 0 and float(timed[2]) > 0
    assert float(timed[3]) < 1e-3  # the export's logits are the bf16 source's
    rounding = re.search(r"fp32 source vs bf16 export \(rounding\): (\S+)", proc.stdout)
    assert rounding and 0 < float(rounding[1]) < 0.1
    assert (tmp_path / "export" / "model.safetensors").stat().st_size > 0
