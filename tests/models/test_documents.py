"""Document masking (docs/training.md, "Documents"): a packed row's documents are read as rows of their own.

For every kind, the logits and the gradients of a packed batch with `doc_ids` equal those of each
document run alone (fp32, 1e-5), and positions, FreeSolo's cells and query blocks, windows and
AR-GRC's scan restart at each document's start.
"""

from __future__ import annotations

import pytest
import torch

from fsframework.config.kinds import KIND_NAMES
from fsframework.models.documents import Documents, document_lengths
from fsframework.ops.document_attention import chunk_size
from tests.utils import tiny_model

VOCAB = 64
# two rows of 3 and 4 documents: lengths that are not multiples of the cells (4) or blocks (8), one
# longer than the window (16) and several blocks, two of the same length (one batched call)
LAYOUT = [[29, 6, 45], [11, 20, 11, 38]]



def packed_batch():
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (len(LAYOUT), sum(LAYOUT[0])))
    doc_ids = torch.tensor([[d for d, size in enumerate(row) for _ in range(size)] for row in LAYOUT])
    return tokens, doc_ids


def documents_alone(model, tokens):
    """Each document's logits run as a row of its own, in the packed order `[B, T, V]`."""
    rows = []
    for b, row in enumerate(LAYOUT):
        starts = [sum(row[:i]) for i in range(len(row))]
        rows.append(torch.cat([model(tokens[b:b + 1, s:s + size])[0] for s, size in zip(starts, row)]))
    return torch.stack(rows)


@pytest.mark.parametrize("name", KIND_NAMES)
def test_a_packed_row_reads_each_document_as_its_own_row(name):
    model = tiny_model(name, VOCAB).float()
    tokens, doc_ids = packed_batch()
    assert sum(LAYOUT[0]) == sum(LAYOUT[1])
    # a loss that weighs every logit, at the scale of a mean loss (gradients of order 1: fp32 sums
    # them over the tokens in another order when the documents run apart)
    probe = torch.randn(*tokens.shape, VOCAB) / tokens.numel()**0.5

    def grads(logits):
        model.zero_grad()
        (logits * probe).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    packed = model(tokens, doc_ids=doc_ids)
    alone = documents_alone(model, tokens)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-5)
    if name == "fsb":  # inference only: no gradients to compare
        return
    packed_grads, alone_grads = grads(model(tokens, doc_ids=doc_ids)), grads(documents_alone(model, tokens))
    assert packed_grads.keys() == alone_grads.keys() and packed_grads
    for key in packed_grads:
        torch.testing.assert_close(packed_grads[key], alone_grads[key], rtol=0, atol=1e-5, msg=key)
    # and masking changes what the packed row reads (the test could fail)
    with torch.no_grad():
        assert not torch.allclose(model(tokens), packed, atol=1e-4)


def test_one_document_per_row_is_the_plain_forward():
    model = tiny_model("fs", VOCAB)
    tokens, _ = packed_batch()
    with torch.no_grad():
        assert torch.equal(model(tokens, doc_ids=torch.zeros_like(tokens)), model(tokens))


def test_document_positions_and_groups():
    docs = Documents(torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 6, 6, 6, 6]]))
    assert docs.positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]]
    assert docs.count == 5 and not docs.whole_rows
    assert document_lengths(torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 6, 6, 6, 6]])) == [3, 2, 1, 2, 4]
    assert sorted(g.shape[1] for g in docs.groups) == [1, 2, 3, 4]  # the two 2-token documents run together
    x = torch.arange(12.0).view(2, 6, 1)
    torch.testing.assert_close(docs.map(lambda rows: rows.cumsum(1), x).view(2, 6),
                               torch.tensor([[0., 1, 3, 3, 7, 5], [6, 13, 8, 17, 27, 38]]))


def test_doc_ids_of_another_shape_are_refused():
    model = tiny_model("tfpp", VOCAB)
    tokens, doc_ids = packed_batch()
    with pytest.raises(ValueError, match="doc_ids must have the tokens' shape"):
        model(tokens, doc_ids=doc_ids[:, 1:])


def _step_work(model, tokens, doc_ids=None):
    from tests.work import WorkCounter

    with WorkCounter() as work:
        if model.training:
            model(tokens, doc_ids=doc_ids).float().logsumexp(dim=-1).mean().backward()
        else:
            with torch.no_grad():
                model(tokens, doc_ids=doc_ids)
    return work


@pytest.mark.parametrize("name", KIND_NAMES)
def test_masking_never_adds_work(name):
    """A training step on packed documents does at most the multiply-adds of the rows read whole (a
    document's queries score only its own keys and cells); what the regrouping copies is a few passes
    over the activations (most, relative to its work, for AR-GRC's scan at this width). FS-B, inference
    only: its forward (the forests of each document, searched in the same call)."""
    model = tiny_model(name, VOCAB).train(name != "fsb")
    length = 256
    tokens = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(0))
    sizes = [[90, 7, 100, 59], [256]]  # one row of four documents, one of a single document
    doc_ids = torch.tensor([[d for d, size in enumerate(row) for _ in range(size)] for row in sizes])
    whole, masked = _step_work(model, tokens), _step_work(model, tokens, doc_ids)
    # a kind's one-call form may score its query chunks' diagonal tiles whole (the dense kinds',
    # fsframework.ops.document_attention): a document as long as the row costs its causal square and
    # C / T more; read each length apart (Documents.map), a document costs exactly its own row
    packed = any(getattr(m, "reads_packed_rows", False) for m in model.modules())
    slack = 1 + chunk_size(length) / length if packed else 1
    assert 0 < masked.macs <= whole.macs * slack, (whole.macs, masked.macs)
    assert masked.written <= 1.75 * whole.written, (whole.written, masked.written)
    # the largest tensor at most a row per document larger: AR-GRC's packed tree scans L + 1 rows a
    # document, so a level of it may pair a few more rows than the whole rows' level does
    documents = sum(len(row) for row in sizes)
    assert masked.largest <= whole.largest * (length + documents) / length, (whole.largest, masked.largest)


def test_masking_under_sequence_parallelism_is_a_valid_config():
    """Ranks of an SP group read their parts' documents (tests/parallel/test_sp_documents.py)."""
    from fsframework.config import load_config

    cfg = load_config(None, ["data.document_masking=true", "parallel.sp=2"])
    assert cfg.data.document_masking and cfg.parallel.sp == 2


def test_the_target_that_crosses_into_the_next_document_is_not_scored():
    import numpy as np

    from fsframework.data.loader import window_batch

    tokens = np.arange(7)[None]
    doc_ids = np.array([[0, 0, 0, 1, 1, 2, 2]])
    batch = window_batch(tokens, doc_ids, skip_boundary_targets=True)
    assert batch["targets"].tolist() == [[1, 2, -100, 4, -100, 6]]  # 3 and 5 start documents
    assert batch["doc_ids"].tolist() == [[0, 0, 0, 1, 1, 2]]  # the inputs' documents
    assert window_batch(tokens, doc_ids)["targets"].tolist() == [[1, 2, 3, 4, 5, 6]]
