"""`tools/bench_loss.py` end to end at a toy size, as a user runs it: a training step with the output head
whole (`loss_chunk` 0) and in chunks, each in a fresh process; one table row and one JSON row per
(vocabulary, N, loss_chunk) with the step time, peak memory and first step, the chunked rows beside the
whole one."""

from __future__ import annotations

import json

from tests.utils import run_tool


def test_whole_head_against_chunks(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_tool("bench_loss.py", "--vocab", "300", "--lengths", "64", "--chunks", "0", "16", "--d-model", "32",
                    "--layers", "1", "--heads", "2", "--threads", "1", "--repeats", "1", "--json", str(out))
    rows = json.loads(out.read_text())
    assert [(r["vocab"], r["n"], r["loss_chunk"]) for r in rows] == [(300, 64, 0), (300, 64, 16)]
    for row in rows:
        assert row["time_s"] > 0 and row["first_s"] > 0 and row["peak_bytes"] >= 0
    table = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| 300 |")]
    assert [[cell.strip() for cell in line[:3]] for line in table] == [["300", "64", "whole"], ["300", "64", "16"]]
    assert table[0][4].strip() == "1.00"  # the whole head against itself
