"""The output head in chunks (`train.loss_chunk`, `models.losses.head_output`): the same per-token
losses and gradients as the whole logits, and the head never runs on more than a chunk of positions,
in the forward or in the backward's recomputation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fsframework.models.losses import head_output, token_losses, weighted_losses
from fsframework.models.registry import MODEL_NAMES
from tests.utils import tiny_model


def rows_seen(head: nn.Module) -> list[int]:
    """The number of positions of each call of `head`, as it happens."""
    seen: list[int] = []
    head.register_forward_hook(lambda module, args, out: seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    return seen


def sample(vocab: int = 50, shape: tuple[int, int] = (2, 13), dim: int = 8):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(*shape, dim, generator=gen, requires_grad=True)
    targets = torch.randint(0, vocab, shape, generator=gen)
    targets[0, 3] = targets[1, 12] = -100
    weights = 1.0 + 9.0 * (torch.rand(shape, generator=gen) < 0.3).float()
    return hidden, targets, weights


@pytest.mark.parametrize("chunk", [1, 7, 16, 26, 1000])
def test_chunks_give_the_whole_logits_losses_and_gradients(chunk):
    torch.manual_seed(0)
    head = nn.Linear(8, 50, bias=False)
    hidden, targets, weights = sample()
    whole = weighted_losses(token_losses(head(hidden), targets), targets, weights)[0]
    want = torch.autograd.grad(whole, (hidden, head.weight))
    seen = rows_seen(head)
    ce = head_output(head, hidden, targets, chunk)
    forward_calls = len(seen)
    got = torch.autograd.grad(weighted_losses(ce, targets, weights)[0], (hidden, head.weight))
    torch.testing.assert_close(ce, token_losses(head(hidden), targets).detach(), rtol=0, atol=1e-6)
    assert ce[0, 3] == 0 and ce[1, 12] == 0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    chunks = -(-26 // chunk)
    if chunk < 26:  # chunked: once per chunk forward, once more in the backward (recomputed)
        assert forward_calls == chunks and max(seen[:-1]) <= chunk and len(seen) - 1 == 2 * chunks
    else:  # one chunk: the whole logits, no recomputation
        assert forward_calls == 1 and len(seen) == 2


def test_without_gradients_each_chunk_runs_once():
    head = nn.Linear(8, 50, bias=False)
    hidden, targets, _ = sample()
    seen = rows_seen(head)
    with torch.no_grad():
        head_output(head, hidden, targets, 10)
    assert seen == [10, 10, 6]


def test_bad_targets_and_chunks_are_refused():
    head = nn.Linear(8, 50, bias=False)
    hidden, targets, _ = sample()
    with pytest.raises(ValueError, match="targets"):
        head_output(head, hidden, targets[:, :5], 4)
    with pytest.raises(ValueError, match="chunk"):
        head_output(head, hidden, targets, -1)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_scores_its_targets_in_chunks(name):
    """model(tokens, targets, loss_chunk) = the losses of model(tokens)'s logits, with the same
    parameter gradients; loss_chunk = 0 is the whole logits, bit for bit."""
    vocab = 40
    model = tiny_model(name, vocab)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (2, 33), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    params = [p for p in model.parameters() if p.requires_grad]
    whole = token_losses(model(inputs), targets)
    want = torch.autograd.grad(whole.mean(), params, allow_unused=True)
    assert torch.equal(model(inputs, targets=targets), whole)
    seen = rows_seen(model.lm_head)
    ce = model(inputs, targets=targets, loss_chunk=10)
    assert seen and max(seen) <= 10
    torch.testing.assert_close(ce, whole, rtol=0, atol=1e-5)
    got = torch.autograd.grad(ce.mean(), params, allow_unused=True)
    for a, b in zip(got, want):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
