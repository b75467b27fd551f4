"""Sequence parallelism equals the single process: logits of every slice and every parameter
gradient, for every model kind, with real gloo ranks (fla's tests/context_parallel idea)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsframework.models.registry import KINDS, MODEL_NAMES
from tests.parallel.ranks import run_ranks

WORKER = Path(__file__).with_name("_equivalence_worker.py")
ALL_KINDS = ",".join(MODEL_NAMES)  # every registry kind
# the kinds the zigzag layout cuts into two runs per rank (the others run contiguous under it, as in
# the contiguous worlds: fsframework.parallel.parallelize)
ZIGZAG_KINDS = ",".join(name for name, kind in KINDS.items() if kind.keys == "prefix" and not kind.language_model)


@pytest.mark.ranks
@pytest.mark.timeout(240)
# zigzag runs at sp 2 and 4 (prefix kinds cut into two runs per rank); data parallelism averages
# whole SP groups' gradients whatever their layout, so sp2xdp2 runs once, contiguous
@pytest.mark.parametrize("world, sp, lengths, layout", [
    pytest.param(2, 2, "100,37", "contiguous", id="sp2-ragged-contiguous"),  # 7 and 3 blocks of 16: unequal slices
    pytest.param(2, 2, "100,37", "zigzag", id="sp2-ragged-zigzag"),
    # a last slice of 4 tokens; the 40-token window spans two ranks; 200: 13 blocks, enough for 8 zigzag runs
    pytest.param(4, 4, "100,200", "contiguous", id="sp4-contiguous"),
    pytest.param(4, 4, "100,200", "zigzag", id="sp4-zigzag"),
    pytest.param(4, 2, "100", "contiguous", id="sp2xdp2-contiguous"),  # two SP groups, different samples
])
def test_sp_matches_single_process(world, sp, lengths, layout):
    kinds = ALL_KINDS if layout == "contiguous" else ZIGZAG_KINDS
    outputs = run_ranks(WORKER, world, str(sp), kinds, lengths, layout, timeout=240)
    # the worker exits non-zero on any mismatch above 1e-5 (relative RMS); make sure it checked everything
    checked = sum(line.count("worst rel rms") for line in outputs)
    assert checked == world * len(kinds.split(",")) * len(lengths.split(","))
    if layout == "zigzag":  # the causal kinds really ran on two runs per rank (too few blocks: one)
        assert all(re.search(r"tfpp N=\d+ zigzag runs \[\(\d+, \d+\), \(", out) for out in outputs)
