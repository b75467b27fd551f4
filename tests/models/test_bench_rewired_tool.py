"""`tools/bench_rewired.py` end to end at a toy size, as a user runs it: a training step of plain
(`tfpp`) and runway-rewired attention at each N, each in a fresh process (on the CPU the rewired model
runs its PyTorch reference), one table row per N with both throughputs, the overhead and peak memory."""

from __future__ import annotations

import re

from tests.utils import run_tool


def test_plain_against_rewired():
    proc = run_tool("bench_rewired.py", "--lengths", "64", "--d-model", "32", "--layers", "1", "--heads", "2",
                    "--vocab", "64", "--runway", "mean", "--repeats", "1")
    assert "runway mean" in proc.stdout
    rows = re.findall(r"^\| (\d+) \| ([\d,]+) \| ([\d,]+) \| ([+-]\d+)% \| ([\d,.]+) \| ([\d,.]+) \|$", proc.stdout,
                      re.MULTILINE)
    assert len(rows) == 1 and rows[0][0] == "64"
    plain, rewired = (float(x.replace(",", "")) for x in rows[0][1:3])  # tokens per second
    assert plain > 0 and rewired > 0
    assert all(float(x.replace(",", "")) >= 0 for x in rows[0][4:])  # peak MiB
