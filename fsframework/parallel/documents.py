"""Document masking under sequence parallelism: a rank's part of packed rows, read as its documents.

Legend: B batch, N sequence, `[a, b)` this rank's slice (contiguous layout), D a layer's input width.

Every rank of an SP group reads the whole rows' `doc_ids` `[B, N]` (the same sample), so each
knows without an exchange where every document starts, on every rank. A document piece on the
rank that starts at or after `a` reads only its own tokens: it runs as on one process
(`fsframework.models.documents.Documents.map`, the whole-sequence form). Only the first piece of
a row can continue a document begun on an earlier rank, at position `o = a - s` of it (`s` its
start): that piece runs the layer's offset form at `start = o` over the document's earlier part.

What travels is the layer's INPUT at the positions before `a`, not its keys: a halo of the `W`
positions before every rank's slice (`halo_exchange`, point to point, backward returns the
gradient to the owners), `W` the longest earlier part of any continued document on any rank,
computed alike on every rank from the whole rows' ids (no rank decides alone, so every rank calls
the same exchanges; `W = 0`: none). The continuing rank projects the document's `o` earlier
inputs itself, at the document's positions (RoPE at `[0, o)`), which gives exactly the keys and
values one process reads. Why inputs: `D` numbers per position where keys and values are `2 D`,
and an earlier rank holds its keys at its own pieces' positions only inside its layer's call (its
last piece's keys are not a tensor of the layer's whole input). The price is the continuing rank's
projection of those `o` positions (`3 D^2` multiply-adds each, q included). AR-GRC exchanges its
leaves the same way and reduces the roots of the earlier part's aligned blocks from them
(`continued_inclusive_prefixes`, at most `o - 1` cell calls).

Bytes received per layer and direction, per rank: `B min(W, a) D` elements (a window kind:
`B min(W, w, a) D`), against `(sp - 1) B L 2 D` for the unmasked all-gather of keys and values
(`L` the longest slice). FS's selected-cell exchange and FS-L's retained cells are not used for
continued pieces: their layer reads the document's whole earlier part.

The zigzag layout is not supported with documents (a rank's second run would continue documents
of its own first run and of every rank's); `parallelize` keeps the contiguous layout under masking.
"""

from __future__ import annotations

from typing import Callable

import torch

from fsframework.models.context import DocumentRows, Span, reach_back
from fsframework.models.documents import Documents, document_positions
from fsframework.parallel.collectives import halo_exchange
from fsframework.parallel.context import SPContext

Exchange = Callable[[torch.Tensor, int], torch.Tensor]  # own `[B, n, ...]`, width -> `[B, min(width, a), ...]`


def rank_documents(doc_ids: torch.Tensor, slices: list[tuple[int, int]], rank: int,
                   device=None) -> tuple[Documents, int]:
    """The `Documents` of rank `rank`'s slice of rows whose documents are `doc_ids` `[B, N]` (its first
    pieces continued at their documents' positions), and the halo width `W` every rank exchanges: the
    longest earlier part of a document that some rank's slice begins inside (the same on every rank)."""
    if doc_ids.dim() != 2 or doc_ids.shape[1] != slices[-1][1]:
        raise ValueError(f"doc_ids must be the whole rows [B, {slices[-1][1]}], got shape {tuple(doc_ids.shape)}")
    doc_ids, device = doc_ids.cpu(), doc_ids.device if device is None else device  # tables on the host
    positions = document_positions(doc_ids)
    width = max([int(positions[:, start].max()) for start, _ in slices[1:]], default=0)
    start, end = slices[rank]
    return Documents(doc_ids[:, start:end], continued=positions[:, start].tolist(), device=device), width


class SequenceParallelDocuments(DocumentRows):
    """`DocumentRows` of one SP rank: its documents, and the earlier tokens of its continued pieces by
    `exchange` (`halo_exchange` over the group; a test hands in another)."""

    def __init__(self, documents: Documents, width: int, exchange: Exchange):
        super().__init__(documents)
        self.width, self.exchange = width, exchange

    def earlier_tokens(self, x: torch.Tensor, span: Span) -> torch.Tensor:
        width = reach_back(span, self.width)  # a window reads no further back than its span
        return self.exchange(x, width) if width else x[:, :0]


def document_rows(sp: SPContext, doc_ids: torch.Tensor, device=None) -> SequenceParallelDocuments:
    """This rank's `SequenceParallelDocuments` of the sequence `sp` (contiguous layout), its tables on
    `device` (the rows'; doc_ids' own by default)."""
    if sp.layout != "contiguous":
        raise ValueError(f"document masking under sequence parallelism needs the contiguous layout, got {sp.layout}")
    documents, width = rank_documents(doc_ids, sp.slices, sp.rank, device)
    return SequenceParallelDocuments(documents, width, lambda x, w: halo_exchange(x, sp, w))
