"""`tools/bench_compile.py` end to end at a toy size, as a user runs it: a training step eager and with the
decoder blocks compiled (`train.compile`; on the CPU torch.compile's inductor builds C++), each in a fresh
process, one table row and one JSON row per kind with each side's step time, peak memory and first step
(the compiled side's includes tracing and code generation)."""

from __future__ import annotations

import json

from tests.utils import run_tool


def test_eager_against_compiled(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_tool("bench_compile.py", "--kinds", "tfpp", "--length", "64", "--d-model", "32", "--layers", "1",
                    "--heads", "2", "--threads", "1", "--repeats", "1", "--json", str(out))
    rows = json.loads(out.read_text())
    assert [row["kind"] for row in rows] == ["tfpp"]
    for side in ("eager", "compiled"):
        figures = rows[0][side]
        assert figures["time_s"] > 0 and figures["first_s"] > 0 and figures["peak_bytes"] >= 0
    assert rows[0]["compiled"]["first_s"] > rows[0]["compiled"]["time_s"]  # the first step compiles
    table = [line for line in proc.stdout.splitlines() if line.startswith("| tfpp |")]
    assert len(table) == 1 and len(table[0].split("|")) == 9  # the 7 columns of the header
