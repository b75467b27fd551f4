"""Document masking under sequence parallelism (fsframework/parallel/documents.py), in one process.

Three ranks are simulated in turn with the real per-rank code (`rank_documents`,
`SequenceParallelDocuments`, every layer's continuation path) and a recorded exchange in place of
`halo_exchange`: rank `r`'s earlier tokens are the last positions of the earlier ranks' inputs to
the same layer call, which they computed first (no rank reads a later one). For every kind the
ranks' logits and the gradients of their summed losses equal the one-process masked forward's, on
rows whose documents cross the rank boundaries mid-block, one of them spanning all three ranks.
"""

from __future__ import annotations

import pytest
import torch

from fsframework.config import ParallelConfig
from fsframework.config.kinds import KIND_NAMES
from fsframework.models.documents import Documents
from fsframework.parallel.batch import shard_batch
from fsframework.parallel.context import SPContext
from fsframework.parallel.documents import SequenceParallelDocuments, document_rows, rank_documents
from fsframework.parallel.groups import ParallelGroups
from fsframework.parallel.parallelize import parallelize, sp_context
from fsframework.parallel.sharding import block_slices
from tests.utils import tiny_model

VOCAB = 64
LENGTH = 60  # blocks of 8: three ranks hold [0, 24), [24, 48), [48, 60)
# row 0: a document over the first boundary at its position 19 and one over the second at 3; row 1: one
# document over both (positions 21 and 45 at the boundaries, more than the window of 16); row 2: documents
# that start at both boundaries (nothing continued)
LAYOUT = [[5, 40, 15], [3, 57], [24, 24, 12]]
SLICES = block_slices(LENGTH, 3, 8)


def packed_batch():
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (len(LAYOUT), LENGTH))
    doc_ids = torch.tensor([[d for d, size in enumerate(row) for _ in range(size)] for row in LAYOUT])
    return tokens, doc_ids


class SimulatedRanks:
    """The model's sequence parallelism for ranks run one after another in this process: `sp` is the
    rank; the exchange hands rank `r` the earlier ranks' inputs to the same layer call."""

    context = None

    def __init__(self, slices: list[tuple[int, int]]):
        self.slices = slices
        self.inputs: list[list[torch.Tensor]] = [[] for _ in slices]  # per rank, every layer call's input
        self.widths: set[int] = set()

    def sequence(self, sp, model_name):
        return sp

    def document_rows(self, rank: int, doc_ids: torch.Tensor, device=None) -> SequenceParallelDocuments:
        documents, width = rank_documents(doc_ids, self.slices, rank, device)
        return SequenceParallelDocuments(documents, width, lambda x, w: self.exchange(rank, x, w))

    def exchange(self, rank: int, x: torch.Tensor, width: int) -> torch.Tensor:
        call = len(self.inputs[rank])
        self.inputs[rank].append(x)
        self.widths.add(width)
        before = torch.cat([self.inputs[r][call] for r in range(rank)] + [x[:, :0]], dim=1)
        return before[:, before.shape[1] - min(width, before.shape[1]):]


def test_a_ranks_documents_and_the_width_every_rank_exchanges():
    _, doc_ids = packed_batch()
    firsts = [rank_documents(doc_ids, SLICES, r) for r in range(3)]
    assert {width for _, width in firsts} == {45}  # row 1's document, 45 tokens before the last slice
    documents = firsts[1][0]
    assert [(row, start, index.numel()) for row, index, start in documents.continuations] == [(0, 19, 21), (1, 21, 24)]
    assert documents.positions[0].tolist() == list(range(19, 40)) + [0, 1, 2]
    assert documents.positions[2].tolist() == list(range(24))
    with pytest.raises(ValueError, match="map needs continue_piece"):
        documents.map(lambda rows: rows, torch.zeros(3, 24))
    assert not Documents(doc_ids).continuations  # whole rows begin their documents


@pytest.mark.parametrize("name", KIND_NAMES)
def test_ranks_reading_continued_documents_equal_one_process(name):
    model = tiny_model(name, VOCAB).float()
    tokens, doc_ids = packed_batch()
    probe = torch.randn(*tokens.shape, VOCAB) / tokens.numel()**0.5
    trains = name != "fsb"  # FS-B is inference only: no gradients to compare

    def grads(logits):
        model.zero_grad()
        (logits * probe).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    with torch.set_grad_enabled(trains):
        whole = model(tokens, doc_ids=doc_ids)
        want = grads(whole) if trains else {}
        ranks = SimulatedRanks(SLICES)
        model.parallelism = ranks
        parts = torch.cat([model(tokens[:, a:b], sp=r, doc_ids=doc_ids) for r, (a, b) in enumerate(SLICES)], dim=1)
        torch.testing.assert_close(parts, whole, rtol=0, atol=1e-5)
        # every layer call of every rank exchanged (the same calls on every rank), a window kind its window only
        assert len({len(calls) for calls in ranks.inputs}) == 1 and ranks.inputs[0]
        assert ranks.widths == ({16} if name == "swa" else {45})
        if trains:
            got = grads(parts)
            assert got.keys() == want.keys() and got
            for key in got:
                torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["argrc", "fs", "tfpp"])
def test_a_rank_whose_rows_all_continue_documents(name):
    """Every row one document over every boundary: the later ranks hold continuation pieces only (no
    document of their own for a one-call form to read), and still equal one process."""
    model = tiny_model(name, VOCAB).float()
    tokens, _ = packed_batch()
    doc_ids = torch.zeros_like(tokens)
    doc_ids[0, 50:] = 1  # a short document at the end of one row: not every rank is continuations only
    with torch.no_grad():
        whole = model(tokens, doc_ids=doc_ids)
        model.parallelism = SimulatedRanks(SLICES)
        parts = torch.cat([model(tokens[:, a:b], sp=r, doc_ids=doc_ids) for r, (a, b) in enumerate(SLICES)], dim=1)
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-5)


def test_masked_ranks_take_the_contiguous_layout_and_keep_the_whole_rows_documents():
    groups = ParallelGroups(rank=1, world_size=3, sp=3, sp_group=None, dp_group=None)
    tokens, doc_ids = packed_batch()
    masked = parallelize(tiny_model("tfpp", VOCAB), ParallelConfig(sp=3, sp_layout="zigzag"), groups, documents=True)
    assert sp_context(masked).layout == "contiguous"
    mine = shard_batch(sp_context(masked), tokens, tokens, doc_ids=doc_ids)
    assert mine.inputs.shape[1] == 24 and mine.doc_ids is doc_ids  # a rank's documents may begin before its slice
    zigzag = SPContext(groups=groups, block_size=8, layout="zigzag").at_length(LENGTH)
    with pytest.raises(ValueError, match="needs the contiguous layout, got zigzag"):
        document_rows(zigzag, doc_ids)
