"""Sequence parallelism equals one process for the rewired model's ablations (mean runway,
bilinear score, runway head 1); the default rewired model is covered with every registry
kind by test_sp_equivalence.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parallel.ranks import run_ranks

WORKER = Path(__file__).with_name("_rewired_ablation_worker.py")


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_sp2_mean_runway_bilinear_matches_single_process():
    outputs = run_ranks(WORKER, 2, "2", "rewired", "100,37")
    checked = sum(line.count("worst rel rms") for line in outputs)
    assert checked == 2 * 2
