"""`doc_perplexity`: held-out documents cut whole from the split's samples, one document a window."""

from __future__ import annotations

import math

import numpy as np
import torch

from fsframework.data.shards import pack_documents, write_mds
from fsframework.data.tokenizers import load_tokenizer
from fsframework.eval.perplexity import document_perplexity, heldout_documents, sequence_nll
from tests.utils import tiny_model

EOS = 256


def _split(tmp_path, sizes):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 256, size).tolist() for size in sizes]
    write_mds(pack_documents(docs, 16, EOS), tmp_path, compression=None)
    return [np.asarray(d + [EOS]) for d in docs]


def test_documents_come_back_whole_across_samples(tmp_path):
    docs = _split(tmp_path, [5, 40, 3, 70, 22, 90, 12])  # documents span 17-token samples
    found = heldout_documents(str(tmp_path), EOS, 23, count=10)
    # the partial sample at the split's end is dropped: the last document (12 tokens) never closes
    expected = [d for d in docs[:-1] if len(d) >= 23]
    assert [len(d) for d in found] == [len(d) for d in expected] == [41, 71, 23, 91]
    for got, want in zip(found, expected):
        np.testing.assert_array_equal(got, want)
    # it stops once `count` documents reach `count_at` tokens
    assert [len(d) for d in heldout_documents(str(tmp_path), EOS, 23, 1, count_at=60)] == [41, 71]


def test_document_perplexity_reads_each_document_alone(tmp_path):
    docs = _split(tmp_path, [5, 40, 3, 70, 22, 90, 12])
    model = tiny_model("tfpp", 260)
    tokenizer = load_tokenizer("byte")
    result = document_perplexity(model, tokenizer, [20, 64, 200], data_dir=str(tmp_path), num_samples=2,
                                 batch_size=1, device="cpu")
    assert result[200].count == 0 and math.isnan(result[200].perplexity)  # no document that long
    assert math.isnan(result[200].floor)
    score = result[64]
    assert score.count == 2  # the 70- and 90-token documents, each read from its own start
    rows = torch.stack([torch.from_numpy(docs[3][:65]), torch.from_numpy(docs[5][:65])])
    with torch.no_grad():
        assert math.isclose(score.perplexity, math.exp(sequence_nll(model, rows[:, :-1], rows[:, 1:]) / 128),
                            rel_tol=1e-6)
    # the floor: the same 128 targets under their own frequencies
    targets = rows[:, 1:].reshape(-1).numpy()
    freq = np.bincount(targets) / targets.size
    assert math.isclose(score.floor, math.exp(-np.log(freq[targets]).mean()), rel_tol=1e-12)
    assert result[20].count == 2
