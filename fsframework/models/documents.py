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
So every kind that can reads the documents in one call instead: a layer's one-call form takes the
documents' positions (`positions`, each token's place in its document: the attention kinds, FreeSolo)
or their lengths laid end to end (`map_packed`, `plain_lengths`: AR-GRC's packed tree), with tables
built on the host once per batch (`derived`); `map` remains for FS-B and for continuation pieces.

Part of a row (a sequence-parallel rank's runs, `fsframework.parallel.documents`): the part is one or
more runs of the row laid end to end (`run_starts`, their first columns), and a run's first document may
have begun before the run does. `continued[row][run]` is the position inside its document of the run's
first token; such a continuation piece does not run through `fn` but through `map`'s
`continue_piece(i, piece [1, m, ...], start)` (`i` its index in `continuations`), a layer's offset form
at `start`, which reads the document's earlier part (`DocumentRows.earlier_tokens`). Every other piece
starts its document here; a run's start always begins a piece, whatever the ids say.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch


class Documents:
    """The documents of a batch of packed rows; see the module docstring."""

    def __init__(self, doc_ids: torch.Tensor, continued: Optional[Sequence] = None, device=None,
                 run_starts: Sequence[int] = (0,)):
        if doc_ids.dim() != 2:
            raise ValueError(f"doc_ids must be [B, T], got shape {tuple(doc_ids.shape)}")
        self.shape = tuple(doc_ids.shape)
        bsz, length = self.shape
        device = doc_ids.device if device is None else torch.device(device)  # the rows' device
        run_starts = [int(c) for c in run_starts]
        if run_starts[0] != 0 or any(not a < b < length for a, b in zip(run_starts, run_starts[1:])):
            raise ValueError(f"run_starts must rise from 0 inside the rows' {length} columns, got {run_starts}")
        offsets = _run_offsets(continued, bsz, len(run_starts))
        # every table is built on the host, once per batch (the trainer hands CPU doc_ids: no
        # device-to-host sync), and moved to the rows' device in one go
        ids = doc_ids.detach().cpu()
        starts = _starts(ids)
        starts[:, run_starts] = True  # runs laid end to end are not one sequence
        flat_starts = starts.reshape(-1).nonzero().squeeze(1)  # row * T + start, in packed order
        lengths = _lengths(flat_starts, bsz * length)
        # the starts that open a run of a row, in packed order (row by row, runs in order), and the
        # position in its document of each one's first token
        run_firsts = torch.searchsorted(flat_starts, (torch.arange(bsz)[:, None] * length
                                                      + torch.tensor(run_starts)).reshape(-1))
        firsts_at = [start for row in offsets for start in row]
        # each token's position in its document, on the host (what per-chunk tables are built from) and
        # on the rows' device (what the layers read)
        self.host_positions = _positions(starts, flat_starts, run_firsts, firsts_at)
        self.positions = self.host_positions.to(device, non_blocking=True)
        self.count = int(flat_starts.numel())
        # a run's first piece that continues a document begun before the run: (row, its packed indices,
        # its first token's position in the document); it runs alone (`map`'s continue_piece)
        continues = torch.zeros_like(flat_starts, dtype=torch.bool)
        self.continuations: list[tuple[int, torch.Tensor, int]] = []
        for i, start in zip(run_firsts.tolist(), firsts_at):
            if start:
                continues[i] = True
                first = int(flat_starts[i])
                self.continuations.append((first // length, torch.arange(first, first + int(lengths[i])), start))
        # the documents that start in these rows, in packed order: what a one-call form reads
        # (`map_packed`); their lengths are host ints, from which per-batch tables are built
        self.plain_lengths: list[int] = lengths[~continues].tolist()
        pieces = [index for _, index, _ in self.continuations]  # on the host
        # what `groups` are built from, if a layer asks for them
        self._by_length = (flat_starts, lengths, continues, pieces)
        self.device = device
        # `map_packed`'s order: the starting documents' tokens, then the continuation pieces
        self.plain_index = self.packed_inverse = None
        if self.continuations:
            plain_index = _plain_index(flat_starts, lengths, continues)
            self.plain_index = plain_index.to(device, non_blocking=True)
            self.packed_inverse = _inverse(torch.cat([plain_index] + pieces)).to(device, non_blocking=True)
        self.continuations = [(row, index.to(device, non_blocking=True), start)
                              for row, index, start in self.continuations]
        self._derived: dict[str, object] = {}

    def derived(self, key: str, build: Callable[[], object]) -> object:
        """`build()`, once per batch: a table a layer derives from the documents (a tree scan's
        gathers), kept for every layer call and recomputation of this batch."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    @property
    def groups(self) -> list[torch.Tensor]:
        """`map`'s batches: for each distinct length `L` of the documents that start here, `[n, L]`, their
        tokens' packed indices (built on first use: a kind that reads packed rows never asks)."""
        return self._grouping()[0]

    def _grouping(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """`groups` and the permutation that puts `map`'s outputs (groups, then continuations) back."""
        def build():
            flat_starts, lengths, continues, pieces = self._by_length
            groups = [(flat_starts[(lengths == size) & ~continues][:, None] + torch.arange(size))
                      for size in sorted(set(self.plain_lengths))]
            order = torch.cat([g.reshape(-1) for g in groups] + pieces)
            move = lambda t: t.to(self.device, non_blocking=True)  # noqa: E731
            return [move(g) for g in groups], move(_inverse(order))

        return self.derived("groups_by_length", build)

    @property
    def plain_documents(self) -> "Documents":
        """The documents that start in these rows laid end to end in one row `[1, P]` (`map_packed`'s order,
        `plain_lengths`): what a kind's one-call form reads beside the continuation pieces, so that a part
        with continuations still reads its other documents in one call. Built once per batch."""
        def build() -> Documents:
            ids = torch.repeat_interleave(torch.arange(len(self.plain_lengths)), torch.tensor(self.plain_lengths))
            return Documents(ids[None], device=self.device)

        return self.derived("plain_documents", build)

    @property
    def whole_rows(self) -> bool:
        """Every row is one document that starts with it: `map` is `fn` itself."""
        return self.count == self.shape[0] and not self.continuations

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
            continue_piece: Optional[Callable[[int, torch.Tensor, int], torch.Tensor]] = None) -> torch.Tensor:
        """`fn` (a whole-sequence form, `[n, L, ...] -> [n, L, ...]`) on each document of `x` `[B, T, ...]`
        as its own row -> `[B, T, ...]` in the packed order. `continue_piece(i, piece [1, m, ...], start)
        -> [1, m, ...]`: the `i`-th of `continuations`, a piece that continues a document at position
        `start` (the module docstring); needed only when some run of the part begins inside a document."""
        if tuple(x.shape[:2]) != self.shape:
            raise ValueError(f"documents of rows {self.shape}, got a tensor of shape {tuple(x.shape)}")
        if self.whole_rows:
            return fn(x)
        if self.continuations and continue_piece is None:
            raise ValueError("these rows begin inside documents: map needs continue_piece to read their earlier part")
        flat = x.reshape(-1, *x.shape[2:])
        groups, inverse = self._grouping()
        outs = [fn(flat[group]) for group in groups]
        outs += [continue_piece(i, flat[index][None], start) for i, (_, index, start) in enumerate(self.continuations)]
        packed = torch.cat([out.reshape(-1, *out.shape[2:]) for out in outs])
        return packed[inverse].view(*self.shape, *packed.shape[1:])

    def map_packed(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                   continue_piece: Optional[Callable[[int, torch.Tensor, int], torch.Tensor]] = None) -> torch.Tensor:
        """`map` through a layer's one-call (varlen) form: `fn` takes the tokens of every document that
        starts in these rows, laid end to end in packed order (`[P, ...]`, lengths `plain_lengths`), and
        reads each as its own sequence, in one call however many documents there are. Continuation
        pieces as in `map`."""
        if tuple(x.shape[:2]) != self.shape:
            raise ValueError(f"documents of rows {self.shape}, got a tensor of shape {tuple(x.shape)}")
        flat = x.reshape(-1, *x.shape[2:])
        if not self.continuations:
            return fn(flat).view(*self.shape, *x.shape[2:])
        if continue_piece is None:
            raise ValueError("these rows begin inside documents: map_packed needs continue_piece to read their "
                             "earlier part")
        # a part whose rows all continue documents (one longer than the part) has no document of its own
        outs = [fn(flat[self.plain_index])] if self.plain_lengths else []
        outs += [continue_piece(i, flat[index][None], start)[0]
                 for i, (_, index, start) in enumerate(self.continuations)]
        packed = torch.cat(outs)
        return packed[self.packed_inverse].view(*self.shape, *packed.shape[1:])


def _starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """`[B, T]` bool: where a document starts (every row's first position, and wherever the id changes)."""
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return starts


def _lengths(flat_starts: torch.Tensor, total: int) -> torch.Tensor:
    """Each document's length from the flat indices of the starts: a document ends at the next start
    (every row begins with one, so no document runs past its row's end)."""
    return torch.diff(flat_starts, append=flat_starts.new_tensor([total]))


def _inverse(order: torch.Tensor) -> torch.Tensor:
    """The permutation that puts a tensor gathered in `order` back in packed order."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return inverse


def _plain_index(flat_starts: torch.Tensor, lengths: torch.Tensor, continues: torch.Tensor) -> torch.Tensor:
    """The packed indices of the tokens of the documents that start in the rows (not continuation
    pieces), in packed order."""
    keep = torch.repeat_interleave(~continues, lengths)
    return keep.nonzero().squeeze(1)


def _run_offsets(continued: Optional[Sequence], bsz: int, runs: int) -> list[list[int]]:
    """`continued` as `[B][runs]` positions >= 0: given per row (`[B]`, one run) or per row and run."""
    if continued is None:
        return [[0] * runs for _ in range(bsz)]
    rows = [[int(c)] if runs == 1 and not isinstance(c, Sequence) else [int(x) for x in c] for c in continued]
    if len(rows) != bsz or any(len(row) != runs or min(row) < 0 for row in rows):
        raise ValueError(f"continued must give {bsz} rows of {runs} positions >= 0, got {continued}")
    return rows


def _row_firsts(flat_starts: torch.Tensor, bsz: int, length: int) -> torch.Tensor:
    """`[B]`: which of the starts opens each row (every row's first position, flat index `row * T`)."""
    return torch.searchsorted(flat_starts, torch.arange(bsz, device=flat_starts.device) * length)


def _positions(starts: torch.Tensor, flat_starts: torch.Tensor, firsts: torch.Tensor,
               continued: Sequence[int]) -> torch.Tensor:
    """`[B, T]`: the position of every token inside its document (the positions a document read alone
    has), the document that opens at `flat_starts[firsts[i]]` counted from `continued[i]`."""
    bsz, length = starts.shape
    index = torch.arange(bsz * length, device=starts.device)
    run = torch.cumsum(starts.reshape(-1).long(), 0) - 1
    base = flat_starts.clone()
    base[firsts] -= torch.tensor(list(continued), device=starts.device, dtype=base.dtype)
    return (index - base[run]).view(bsz, length)


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """`[B, T]`: the position of every token of `doc_ids` `[B, T]` inside its document."""
    starts = _starts(doc_ids)
    flat_starts = starts.reshape(-1).nonzero().squeeze(1)
    bsz, length = doc_ids.shape
    return _positions(starts, flat_starts, _row_firsts(flat_starts, bsz, length), [0] * bsz)


def document_lengths(doc_ids: torch.Tensor) -> list[int]:
    """The lengths of the documents packed in `doc_ids` `[B, T]`, row by row."""
    return _lengths(_starts(doc_ids).reshape(-1).nonzero().squeeze(1), doc_ids.numel()).tolist()


def documents_of(doc_ids: Optional[torch.Tensor], device=None) -> Optional[Documents]:
    """`Documents` of `doc_ids` `[B, T]` for rows on `device` (doc_ids' own by default), None for None
    (each row is one document)."""
    return None if doc_ids is None else Documents(doc_ids, device=device)
