"""Perplexity at long lengths runs the output head a chunk of positions at a time
(fsframework.eval.perplexity.sequence_nll): the same loss as the whole `[B, T, V]` logits, and no
head call ever covers more than the chunk, for every registered model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fsframework.eval.perplexity import sequence_nll
from fsframework.models.registry import MODEL_NAMES
from tests.utils import tiny_model

VOCAB, LENGTH, CHUNK = 61, 40, 8


@pytest.mark.parametrize("name", MODEL_NAMES)
@torch.inference_mode()
def test_chunked_head_gives_the_whole_logits_loss_and_never_more_than_a_chunk(name):
    model = tiny_model(name, VOCAB)
    tokens = torch.randint(0, VOCAB, (2, LENGTH + 1), generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    whole = F.cross_entropy(model(inputs).float().flatten(0, 1), targets.flatten(), reduction="sum").item()
    widths = []
    hook = model.lm_head.register_forward_hook(lambda _, __, out: widths.append(out.shape[:-1].numel()))
    try:
        chunked = sequence_nll(model, inputs, targets, chunk=CHUNK)
    finally:
        hook.remove()
    assert chunked == pytest.approx(whole, rel=1e-5)
    # the head ran on every position once, a chunk of positions of both rows at a time
    assert widths == [2 * CHUNK] * (LENGTH // CHUNK)
