"""Packed rows read as their documents (docs/training.md, "Documents").

A training row packs several documents (`doc_ids` `[B, T]`: a document is a maximal run of equal
consecutive ids). With document masking on, every sequence-mixing layer reads each document as if
it were a row of its own, as varlen attention reads the sequences of `cu_seqlens`: its queries see
only its keys, its positions, FreeSolo's cells and query blocks, the local window and AR-GRC's scan
all start at the document's start. The token-wise layers (embeddings, norms, MLPs, the head) do not
mix positions, so they run on the packed rows unchanged.

`Documents` does this once for every kind: `map(fn, x)` cuts a packed `[B, T, ...]` tensor into its
documents, runs `fn` on the documents of each length together (a batch `[n, L, ...]`: no padding,
so no position reads anything that is not its own document's and no work is done for positions
that do not exist), and puts the results back in the packed order. `fn` is a layer's
whole-sequence form, unchanged; gradients flow through the gather and the scatter.

Cost: a document of `L` tokens costs what a row of `L` tokens costs, so a packed row's work is the
sum over its documents, never more than the row read whole (every kind's work grows at least
linearly with length). The price is one call of `fn` per distinct document length in the batch.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch


class Documents:
    """The documents of a batch of packed rows; see the module docstring."""

    def __init__(self, doc_ids: torch.Tensor):
        if doc_ids.dim() != 2:
            raise ValueError(f"doc_ids must be [B, T], got shape {tuple(doc_ids.shape)}")
        self.shape = tuple(doc_ids.shape)
        bsz, length = self.shape
        device = doc_ids.device
        starts = _starts(doc_ids)
        flat_starts = starts.reshape(-1).nonzero().squeeze(1)  # row * T + start, in packed order
        lengths = _lengths(flat_starts, bsz * length)
        # the position of every token inside its document (the positions a document read alone has)
        index = torch.arange(bsz * length, device=device)
        run = torch.cumsum(starts.reshape(-1).long(), 0) - 1
        self.positions = (index - flat_starts[run]).view(bsz, length)
        self.count = int(flat_starts.numel())
        # documents of one length run together: gather[L] `[n, L]` holds their tokens' packed indices
        self.groups: list[torch.Tensor] = []
        for size in torch.unique(lengths).tolist():
            firsts = flat_starts[lengths == size]
            self.groups.append(firsts[:, None] + torch.arange(size, device=device))
        order = torch.cat([g.reshape(-1) for g in self.groups])
        self.inverse = torch.empty_like(order)
        self.inverse[order] = torch.arange(order.numel(), device=device)

    @property
    def whole_rows(self) -> bool:
        """Every row is one document: `map` is `fn` itself."""
        return self.count == self.shape[0]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """`fn` (a whole-sequence form, `[n, L, ...] -> [n, L, ...]`) on each document of `x` `[B, T, ...]`
        as its own row -> `[B, T, ...]` in the packed order."""
        if tuple(x.shape[:2]) != self.shape:
            raise ValueError(f"documents of rows {self.shape}, got a tensor of shape {tuple(x.shape)}")
        if self.whole_rows:
            return fn(x)
        flat = x.reshape(-1, *x.shape[2:])
        outs = [fn(flat[group]) for group in self.groups]
        packed = torch.cat([out.reshape(-1, *out.shape[2:]) for out in outs])
        return packed[self.inverse].view(*self.shape, *packed.shape[1:])


def _starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """`[B, T]` bool: where a document starts (every row's first position, and wherever the id changes)."""
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return starts


def _lengths(flat_starts: torch.Tensor, total: int) -> torch.Tensor:
    """Each document's length from the flat indices of the starts: a document ends at the next start
    (every row begins with one, so no document runs past its row's end)."""
    return torch.diff(flat_starts, append=flat_starts.new_tensor([total]))


def document_lengths(doc_ids: torch.Tensor) -> list[int]:
    """The lengths of the documents packed in `doc_ids` `[B, T]`, row by row."""
    return _lengths(_starts(doc_ids).reshape(-1).nonzero().squeeze(1), doc_ids.numel()).tolist()


def documents_of(doc_ids: Optional[torch.Tensor]) -> Optional[Documents]:
    """`Documents` of `doc_ids` `[B, T]`, None for None (each row is one document)."""
    return None if doc_ids is None else Documents(doc_ids)
