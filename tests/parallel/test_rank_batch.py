"""A rank's part of a batch (`fsframework.parallel.batch`): inputs, targets and weights cut to the
same runs, and losses that average over the ranks of an SP group to the whole sequence's loss.
The ranks are simulated: the cutting and the loss need no process group."""

from __future__ import annotations

import pytest
import torch

from fsframework.config import ModelConfig, ParallelConfig
from fsframework.models.losses import lm_losses
from fsframework.models.registry import build_model
from fsframework.parallel.batch import shard_batch
from fsframework.parallel.context import SPContext
from fsframework.parallel.groups import ParallelGroups
from fsframework.parallel.parallelize import parallelize
from fsframework.parallel.sharding import shard_runs

SP, N, VOCAB = 4, 70, 11


def rank_context(rank: int, layout: str) -> SPContext:
    groups = ParallelGroups(rank=rank, world_size=SP, sp=SP, sp_group=None, dp_group=None)
    return SPContext(groups=groups, block_size=8, layout=layout)


def sample():
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, VOCAB, (2, N), generator=gen)
    targets = torch.randint(0, VOCAB, (2, N), generator=gen)
    targets[0, 3] = targets[1, 50:60] = -100
    weights = 1.0 + 9.0 * (torch.rand(2, N, generator=gen) < 0.2).float()
    logits = torch.randn(2, N, VOCAB, generator=gen)
    return inputs, targets, weights, logits


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_ranks_losses_average_to_the_whole_sequences(layout, weighted):
    inputs, targets, weights, logits = sample()
    weights = weights if weighted else None
    whole = lm_losses(logits, targets, weights)
    losses, covered = [], []
    for rank in range(SP):
        mine = shard_batch(rank_context(rank, layout), inputs, targets, weights)
        runs = mine.sp.runs
        assert torch.equal(mine.inputs, shard_runs(inputs, runs)) and torch.equal(mine.targets, shard_runs(targets, runs))
        assert (mine.weights is None) == (weights is None)
        losses.append(torch.stack(mine.losses(shard_runs(logits, runs))))
        covered += [p for s, e in runs for p in range(s, e)]
    assert sorted(covered) == list(range(N)), "the runs of the group cover the sequence once"
    if layout == "zigzag":
        assert len(runs) == 2
    torch.testing.assert_close(torch.stack(losses).mean(0), torch.stack(whole), rtol=1e-6, atol=0)


def test_on_one_process_the_batch_is_the_whole_batch_and_its_loss_the_plain_one():
    inputs, targets, weights, logits = sample()
    mine = shard_batch(None, inputs, targets, weights)
    assert mine.inputs is inputs and mine.sp is None
    assert all(torch.equal(a, b) for a, b in zip(mine.losses(logits), lm_losses(logits, targets, weights)))


def test_a_context_without_a_sequence_and_a_parallel_model_without_its_context_are_refused():
    with pytest.raises(ValueError, match="at_length"):
        rank_context(0, "contiguous").runs
    model = build_model(ModelConfig(name="tfpp", vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2))
    parallelize(model, ParallelConfig(sp=SP), rank_context(0, "contiguous").groups)
    with pytest.raises(TypeError, match="shard_batch"):
        model(torch.zeros(1, 16, dtype=torch.long))
