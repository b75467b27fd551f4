"""Synthetic repeated-passage batches (the copy warmup's and the copy probes' data)."""

from __future__ import annotations

import pytest
import torch

from fsframework.data.synthetic import repeat_batch


def test_same_seed_same_batch_and_passage_bounds_checked():
    a = repeat_batch(torch.Generator().manual_seed(3), 2, 40, draw=50, max_passage=8)
    b = repeat_batch(torch.Generator().manual_seed(3), 2, 40, draw=50, max_passage=8)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert int(a[0].max()) < 50
    with pytest.raises(ValueError, match="passage lengths"):
        repeat_batch(torch.Generator(), 1, 40, draw=50, max_passage=1)
