"""`tools/bench_zero3_layout.py` end to end on two CPU ranks under DeepSpeed ZeRO-3, as a user runs it: the
parameter elements and gather calls of one training step per layout, per rank, under the setting that
releases every parameter after each call (`--settings tight`, the one where the layouts differ). Zigzag as
fsframework configures it (attention modules ZeRO-3 leaves) gathers what contiguous gathers; without the
leaves each attention module's two calls per layer gather its projections twice."""

from __future__ import annotations

import json

import pytest

from tests.utils import run_tool

LAYOUTS = ("contiguous", "zigzag", "zigzag without leaves")


@pytest.mark.ranks
def test_gathers_per_layout(tmp_path):
    out = tmp_path / "records.json"
    proc = run_tool("bench_zero3_layout.py", "--kinds", "tfpp", "--sp", "2", "--n", "512", "--settings", "tight",
                    "--d-model", "384", "--json", str(out))
    records = json.loads(out.read_text())
    assert sorted((r["layout"], r["setting"], r["kind"], r["sp"], r["n"]) for r in records) == sorted(
        (layout, "tight", "tfpp", 2, 512) for layout in LAYOUTS for _rank in range(2))
    assert all(r["elements"] > 0 and r["calls"] > 0 and r["params"] > 0 for r in records)
    most = {layout: max(r["elements"] for r in records if r["layout"] == layout) for layout in LAYOUTS}
    assert most["zigzag"] == most["contiguous"] < most["zigzag without leaves"]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:2] == ["tfpp", "tight"]]
    assert len(rows) == 1 and rows[0][2:4] == ["2", "512"] and rows[0][-1].count("/") == 2  # calls per layout
