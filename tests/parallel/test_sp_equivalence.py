"""Sequence parallelism equals the single process: logits of every slice and every parameter
gradient, for every model kind, with real gloo ranks (fla's tests/context_parallel idea)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsframework.models.registry import KINDS, MODEL_NAMES
from tests.parallel.ranks import run_ranks

WORKER = Path(__file__).with_name("_equivalence_worker.py")
ALL_KINDS = MODEL_NAMES  # every registry kind
BOTH_LAYOUTS = "contiguous,zigzag"


@pytest.mark.ranks
@pytest.mark.timeout(240)
# each world checks both layouts (zigzag: the prefix kinds cut into two runs per rank, the worker's
# kinds_under) at sp 2 and 4; data parallelism averages whole SP groups' gradients whatever their
# layout, so sp2xdp2 runs contiguous only
# sp2-ragged also checks the rewired model's ablations (the worker's `rewired-ablation`: mean runway, a
# prefix sum across slices; bilinear score with Bmat off the identity; runway head 1) and FS-L routing by
# the cells' token keys (`fsl-tokens`: the retained cells' zero prefix, routed by the op)
@pytest.mark.parametrize("world, sp, lengths, layouts, extra", [
    pytest.param(2, 2, "100,37", BOTH_LAYOUTS, ["rewired-ablation", "fsl-tokens"],
                 id="sp2-ragged"),  # 7 and 3 blocks of 16
    # a last slice of 4 tokens; the 40-token window spans two ranks; 200: 13 blocks, enough for 8 zigzag runs
    pytest.param(4, 4, "100,200", BOTH_LAYOUTS, [], id="sp4"),
    pytest.param(4, 2, "100", "contiguous", [], id="sp2xdp2-contiguous"),  # two SP groups, different samples
])
def test_sp_matches_single_process(world, sp, lengths, layouts, extra):
    outputs = run_ranks(WORKER, world, str(sp), ",".join([*ALL_KINDS, *extra]), lengths, layouts, timeout=240)
    # the worker exits non-zero on any mismatch above 1e-5 (relative RMS); make sure it checked everything
    kinds = {"contiguous": len(ALL_KINDS) + len(extra),  # the rewired ablation is a prefix kind: zigzag cuts it too
             "zigzag": sum(1 for k in ALL_KINDS if KINDS[k].keys == "prefix" and not KINDS[k].language_model)
             + sum(1 for k in extra if k == "rewired-ablation")}
    checked = sum(line.count("worst rel rms") for line in outputs)
    assert checked == world * sum(kinds[layout] for layout in layouts.split(",")) * len(lengths.split(","))
    if sp == 4:  # FS's and FS-L's keys were compact on some rank (the queries read only some earlier cells)
        for kind, layout in [("fs", "contiguous"), ("fs", "zigzag"), ("fsl", "contiguous")]:
            assert any(f"{kind} N=200 {layout} compact keys True" in out for out in outputs), (kind, layout)
        # FS's cells were relayed somewhere (a rank that fetched a cell from its owner forwarded it)
        assert re.search(r"fs N=\d+ \w+ compact keys \w+ relayed [1-9]", "".join(outputs))
    if "zigzag" in layouts:  # the causal kinds really ran on two runs per rank (too few blocks: one)
        assert all(re.search(r"tfpp N=\d+ zigzag runs \[\(\d+, \d+\), \(", out) for out in outputs)
