"""`tools/bench_attention.py` end to end at a toy size, as a user runs it: each (case, N) in its own process,
a line per case with its wall time, CPU time and peak memory, then the three tables (wall time, CPU time,
peak memory) with a row per case, dense first (the cases are measured against it)."""

from __future__ import annotations

import re

from tests.utils import run_tool


def test_cases_against_dense():
    proc = run_tool("bench_attention.py", "--cases", "fsl", "--lengths", "256", "--heads", "1", "--head-dim", "16",
                    "--repeats", "1")
    measured = re.findall(r"^  (\S+)\s+N=(\d+)\s+([\d.]+) s wall\s+([\d.]+) s cpu\s+([\d.]+) MiB$", proc.stdout,
                          re.MULTILINE)
    assert [(case, n) for case, n, *_ in measured] == [("dense", "256"), ("fsl", "256")]  # dense added
    for *_, wall, cpu, peak in measured:  # printed to 1 ms: a toy case on an idle machine may print 0.000
        assert float(wall) >= 0 and float(cpu) >= 0 and float(peak) >= 0
    for title in ("wall time (s)", "CPU time (s)", "peak memory (MiB above inputs)"):
        table = proc.stdout.split(f"\n{title}\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert table[0].split() == ["case", "N=256", "/dense@256", "exponent"]
        assert [row.split()[0] for row in table[2:]] == ["dense", "fsl"]
    wall_table = proc.stdout.split("\nwall time (s)\n", 1)[1].splitlines()
    assert wall_table[2].split()[2] == "1.000"  # dense against itself
