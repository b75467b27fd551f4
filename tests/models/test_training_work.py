"""A training step of the kinds whose attention is linear in the length (SWA, FS-L, AR-GRC) costs linear
work: multiply-adds and elements written (tests/work.py) of a forward and backward pass at 4x the
length grow about 4x. The ops have their own guards (tests/ops/test_work_counts.py); this one covers
what joins them in a model (masks, position tables, losses), where an `N x N` tensor would show as
16x here."""

from __future__ import annotations

import pytest
import torch

from tests.utils import tiny_model
from tests.work import WorkCounter

VOCAB, LENGTH = 64, 1024
LINEAR = 4.5  # 4x the length, plus slack for constant terms (4.3 for SWA and FS-L at these sizes)


def _step(model, length: int) -> WorkCounter:
    tokens = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(0))
    with WorkCounter() as work:
        model(tokens).float().logsumexp(dim=-1).mean().backward()
    return work


@pytest.mark.parametrize("name", ["swa", "fsl", "argrc"])
def test_a_training_step_of_a_linear_kind_is_linear_in_the_length(name):
    model = tiny_model(name, VOCAB).train()
    short, long = _step(model, LENGTH), _step(model, 4 * LENGTH)
    assert 0 < long.macs <= LINEAR * short.macs, (short.macs, long.macs)
    assert 0 < long.written <= LINEAR * short.written, (short.written, long.written)
    assert long.largest <= LINEAR * short.largest, (short.largest, long.largest)  # no N x N tensor
