"""`tools/bench_documents.py` end to end at toy sizes, as a user runs it: the step-time mode (a table and
JSON rows per kind with the unmasked and masked step times, their ratio and the aten ops of one forward
each way) and the `--launches` mode (Triton launches of one layer under the interpreter, per document
count). Only the rows' shape, types and positivity are checked: the numbers themselves are what a change
to document masking is meant to move."""

from __future__ import annotations

import json
import math

from tests.utils import run_tool


def test_step_times_and_aten_ops(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_tool("bench_documents.py", "--kinds", "tfpp,argrc", "--seq-len", "64", "--docs", "4", "--steps", "1",
                    "--rounds", "1", "--json", str(out))
    rows = json.loads(out.read_text())
    assert [row["kind"] for row in rows] == ["tfpp", "argrc"]
    for row in rows:
        assert row["docs"] == 4 and row["seq_len"] == 64 and row["batch"] == 2
        assert 1 <= row["docs_per_row"] <= 64 and isinstance(row["distinct_lengths"], int)
        for key in ("unmasked_s", "masked_s", "ratio"):
            assert isinstance(row[key], float) and math.isfinite(row[key]) and row[key] > 0, key
        for key in ("aten_ops_masked", "aten_ops_unmasked"):
            assert isinstance(row[key], int) and row[key] > 0, key
    table = proc.stdout.splitlines()
    assert table[1].split()[:2] == ["kind", "docs"] and "aten ops masked" in table[1]
    assert [line.split()[0] for line in table[3:]] == ["tfpp", "argrc"]


def test_triton_launches(tmp_path):
    out = tmp_path / "launches.json"
    proc = run_tool("bench_documents.py", "--launches", "--kinds", "swa", "--launch-seq-len", "64",
                    "--launch-docs", "1,4", "--json", str(out))
    (row,) = json.loads(out.read_text())
    assert row["kind"] == "swa" and row["seq_len"] == 64 and "error" not in row
    assert set(row["launches"]) == {"1", "4"}
    for count in row["launches"].values():
        assert isinstance(count, int) and count > 0
    assert row["distinct_lengths"] == {"1": 1, "4": 4}
    assert isinstance(row["ratio"], float) and row["ratio"] > 0
    assert row["verdict"] in ("yes", "yes (fewer)", "no (more)")
    assert "TRITON_INTERPRET=1" in proc.stdout and proc.stdout.splitlines()[-1].split()[0] == "swa"


def test_launches_of_an_inference_only_kind(tmp_path):
    """FS-B has no training step: its forward's launches. The interpreter runs a search program per
    (head, forest, query), so one head and one forest (`--set`)."""
    out = tmp_path / "launches.json"
    run_tool("bench_documents.py", "--launches", "--kinds", "fsb", "--launch-seq-len", "96", "--launch-docs", "1,2",
             "--set", "model.n_heads=1", "--set", "model.attention.fsb.forests=f0", "--json", str(out))
    (row,) = json.loads(out.read_text())
    assert row["kind"] == "fsb" and "error" not in row
    # blocks of 64 tokens: one row searches at 64; its two documents (32 and 64 tokens) fit a block each
    assert row["kernels"]["1"]["fsb_beam_kernel"] == 1 and "fsb_beam_kernel" not in row["kernels"]["2"]
    assert row["verdict"] == "yes (fewer)"
