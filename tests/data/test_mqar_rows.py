"""The associative-recall rows (docs/evaluation.md §4.6): every scored target is the value that
followed the same key in the context, seeded rows, exact resume of the training loader."""

from __future__ import annotations

import pytest
import torch

from fsframework.config import ConfigError, MqarConfig, load_config
from fsframework.data.mqar import RecallTaskLoader, recall_rows

SPEC = MqarConfig(pairs=6, queries=4, keys=16, values=16, filler=8)


def test_every_scored_target_is_the_value_after_its_key_in_the_context():
    rows = recall_rows(torch.Generator().manual_seed(0), SPEC, 5, 95)
    assert rows.tokens.shape == (5, 96) and rows.weights.shape == rows.source.shape == (5, 95)
    inputs, targets = rows.tokens[:, :-1], rows.tokens[:, 1:]
    context = 96 - 2 * SPEC.queries
    for b in range(5):
        scored = rows.weights[b].nonzero().flatten()
        assert len(scored) == SPEC.queries and bool((scored >= context).all())
        keys_in_context = inputs[b, :context]
        keys = keys_in_context[keys_in_context < SPEC.keys]
        assert len(keys) == SPEC.pairs == len(set(keys.tolist()))  # distinct keys, each once
        for i in scored.tolist():
            source = int(rows.source[b, i])
            assert inputs[b, source] == targets[b, i]  # the answer sits at `source` ...
            assert inputs[b, source - 1] == inputs[b, i]  # ... right after the same key
            assert SPEC.keys <= int(targets[b, i]) < SPEC.keys + SPEC.values
        assert bool((rows.source[b][rows.weights[b] == 0] == -1).all())
    distance = rows.distance()
    assert bool((distance[rows.weights > 0] > 0).all()) and bool((distance[rows.weights == 0] == -1).all())


def test_rows_are_seeded_and_pairs_spread_over_the_whole_context():
    a = recall_rows(torch.Generator().manual_seed(3), SPEC, 64, 511)
    b = recall_rows(torch.Generator().manual_seed(3), SPEC, 64, 511)
    assert torch.equal(a.tokens, b.tokens)
    sources = a.source[a.weights > 0]
    assert int(sources.min()) < 64 and int(sources.max()) > 400  # near the start and near the queries


def test_loader_resumes_exactly_and_ranks_differ():
    loader = RecallTaskLoader(SPEC, 2, 63, seed=7, rank=0)
    next(loader)
    state = loader.state_dict()
    want = next(loader)
    resumed = RecallTaskLoader(SPEC, 2, 63, seed=7, rank=0)
    resumed.load_state_dict(state)
    got = next(resumed)
    assert all(torch.equal(got[k], want[k]) for k in ("inputs", "targets", "weights"))
    other = RecallTaskLoader(SPEC, 2, 63, seed=7, rank=1)
    other.load_state_dict(state)
    assert not torch.equal(next(other)["inputs"], want["inputs"])
    with pytest.raises(ValueError, match="not from a data.source=mqar run"):
        resumed.load_state_dict({"epoch": 0})


@pytest.mark.parametrize("override, named", [
    (["data.mqar.queries=9", "data.mqar.pairs=8"], "data.mqar.queries=9 exceeds"),
    (["data.mqar.keys=300", "data.mqar.pairs=8"], "more than model.vocab_size"),
    (["data.seq_len=16"], "cannot hold"),
    (["train.eval_every=5"], "train.eval_every"),
])
def test_bad_sizes_are_named(override, named):
    with pytest.raises(ConfigError, match=named):
        load_config(None, ["data.source=mqar", *override])
