"""Sequence parallelism equals the single process: logits of every slice and every parameter
gradient, for every model kind, with real gloo ranks (fla's tests/context_parallel idea)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsframework.models.registry import MODEL_NAMES
from tests.parallel.ranks import run_ranks

WORKER = Path(__file__).with_name("_equivalence_worker.py")
ALL_KINDS = ",".join(MODEL_NAMES)  # every registry kind


@pytest.mark.ranks
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world, sp, lengths", [
    pytest.param(2, 2, "100,37", id="sp2-ragged"),  # 7 and 3 blocks of 16: slices of unequal length
    pytest.param(4, 4, "100", id="sp4"),  # a last slice of 4 tokens; the 40-token window spans two ranks
    pytest.param(4, 2, "100", id="sp2xdp2"),  # two SP groups with different samples, DP-averaged gradients
])
def test_sp_matches_single_process(world, sp, lengths):
    outputs = run_ranks(WORKER, world, str(sp), ALL_KINDS, lengths)
    # the worker exits non-zero on any mismatch above 1e-5 (relative RMS); make sure it checked everything
    checked = sum(line.count("worst rel rms") for line in outputs)
    assert checked == world * len(ALL_KINDS.split(",")) * len(lengths.split(","))
