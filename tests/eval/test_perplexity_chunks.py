"""Perplexity at long lengths runs the output head a chunk of positions at a time
(fsframework.eval.perplexity.sequence_nll): the same loss as the whole `[B, T, V]` logits, and no
head call ever covers more than the chunk, for every registered model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fsframework.data.shards import pack_documents, write_mds
from fsframework.eval.perplexity import heldout_tokens, sequence_nll
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


def test_the_held_out_stream_is_the_packed_documents_with_no_token_skipped(tmp_path):
    """`heldout_tokens` joins the stored samples whole: they are disjoint cuts of the packed stream, so
    dropping a sample's last token (a target in training) would skip one token at every boundary."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 200, size=int(n)).tolist() for n in rng.integers(3, 40, size=30)]
    seq_len, eos = 16, 0
    count = write_mds(pack_documents(docs, seq_len, eos), tmp_path / "eval", compression=None)
    packed = np.concatenate([np.append(np.asarray(d), eos) for d in docs])[: count * (seq_len + 1)]
    stream = heldout_tokens(str(tmp_path / "eval"), 10 ** 6)
    assert count > 3 and np.array_equal(stream, packed)
    assert np.array_equal(heldout_tokens(str(tmp_path / "eval"), 40), packed[: 3 * (seq_len + 1)])  # whole samples
