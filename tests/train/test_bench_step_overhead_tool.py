"""`tools/bench_step_overhead.py` end to end at a toy size, as a user runs it: the quickstart model's
training step bare, with the step clock and profiler hooks, and with a logged step's record, each way's
median step time and its ratio to the bare loop, and the bare loop's spread."""

from __future__ import annotations

import re

from tests.utils import run_tool


def test_three_ways_against_the_bare_loop():
    proc = run_tool("bench_step_overhead.py", "--steps", "2", "--rounds", "1", "--seq-len", "32")
    ways = re.findall(r"^(\w+)\s+median step\s+([\d.]+) ms\s+ratio to bare ([\d.]+)$", proc.stdout, re.MULTILINE)
    assert [way for way, *_ in ways] == ["bare", "clocked", "logged"]
    assert all(float(ms) > 0 and float(ratio) > 0 for _, ms, ratio in ways)
    assert float(ways[0][2]) == 1.0
    assert re.search(r"interquartile spread: [\d.]+% of its median", proc.stdout)
