"""Document masking under sequence parallelism: a rank's part of packed rows, read as its documents.

Legend: B batch, N sequence, D a layer's input width. A rank holds one run of the rows (contiguous
layout) or two (zigzag: an early and a late one, `fsframework.parallel.sharding`), laid end to end.

Every rank of an SP group reads the whole rows' `doc_ids` `[B, N]` (the same sample), so each knows
without an exchange where every document starts and which rank holds every position. A document piece
that starts inside a run reads only its own tokens: it runs as on one process (`Documents.map`, the
whole-sequence form, or a kind's one-call form). Only a run's first piece can continue a document begun
before the run, at position `o = a - s` of it (`a` the run's start, `s` the document's): that piece runs
the layer's offset form at `start = o` over the document's earlier part, wherever that lies (earlier
ranks, and under zigzag also later ranks' early runs and the rank's own early run).

What travels is the layer's INPUT at the positions each continuation piece reads, not its keys
(`gather_earlier`, point to point, the backward returning the gradient to the owners): for each piece
the `reach_back(span, o)` positions before it (its document's earlier part; a window kind its window),
exactly those and nothing for a row that continues nothing. Every rank computes every rank's plan alike
from the whole rows' ids (no rank decides alone, so the ranks' messages match). The continuing rank
projects the document's earlier inputs itself, at the document's positions (RoPE at `[0, o)`), which
gives exactly the keys and values one process reads. Why inputs: `D` numbers per position where keys
and values are `2 D`, and an earlier rank holds its keys at its own pieces' positions only inside its
layer's call. The price is the continuing rank's projection of those positions (`3 D^2` multiply-adds
each, q included). AR-GRC moves the roots of the earlier part's aligned blocks instead, reduced by the
ranks that hold their leaves (`fsframework.parallel.document_roots`).

Bytes received per layer and direction, per rank: `sum over its pieces of reach D` elements, against
`(sp - 1) B L 2 D` for the unmasked all-gather of keys and values (`L` the longest slice). FreeSolo's
pieces receive what they read (`continued_keys`): FS routes from the holders' summaries and receives its
selected cells (`fsframework.parallel.document_selected`), FS-L the document's top cells
(`document_retained`); both with the inputs of the region before the piece.

Balance: under the zigzag layout (the kinds whose work grows with position: `sequence_layouts`) the rows
are cut into `4 sp` chunks dealt to the ranks by the documents' causal work (`document_runs`), so every
rank's work stays within a few percent of the mean whatever the documents (`tools/bench_sp.py --only work`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial
from typing import Callable, Optional

import torch

from fsframework.models.context import DocumentRows, RetainedCells, Span, reach_back
from fsframework.models.documents import Documents, document_positions
from fsframework.parallel.collectives import exchange
from fsframework.parallel.context import SPContext
from fsframework.parallel.document_retained import RoutedHere, piece_cells, plan_retained, retained_keys
from fsframework.parallel.document_roots import RootsPlan, continued_roots, plan_roots
from fsframework.parallel.document_selected import region_span, selected_keys
from fsframework.parallel.rank_layout import RankLayout, Transport, continued_runs, exchange_rows

Segment = tuple[int, int, int]  # (row, lo, hi): positions [lo, hi) of a row, global or a rank's own columns


@dataclass(frozen=True)
class EarlierPlan:
    """One rank's part of an exchange of continuation pieces' earlier inputs (`plan_earlier`).

    `size`: positions its pieces read in all (their reaches added up, in its `continuations` order);
    `local`: `(row, lo, hi, out)` own columns copied to output position `out`; `recvs[peer]`: `(rows,
    ranges)`, the message's length and the output ranges `(out, out_end, at)` filled from its rows `at`
    on (pieces of one document may read the same rows: each moves once); `sends[peer]`: own segments
    `(row, lo, hi)` whose inputs make up the message to `peer`, in order."""

    size: int
    local: tuple[tuple[int, int, int, int], ...]
    recvs: tuple[tuple[int, int, tuple[tuple[int, int, int], ...]], ...]
    sends: tuple[tuple[int, tuple[Segment, ...]], ...]
    columns: int = 0  # the rank's part's length (its runs end to end): what the flat indices count in

    @cached_property
    def indices(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Host index tensors, built once per plan (every layer call reuses them): the flat rows of the
        segments sent, of the own rows copied, and each output position's row of (own rows, then the
        received ones; a received row may serve several)."""
        sent = _flat_index([seg for _, segments in self.sends for seg in segments], self.columns)
        own = _flat_index([(row, lo, hi) for row, lo, hi, _ in self.local], self.columns)
        index = torch.empty(self.size, dtype=torch.long)
        at = 0
        for _, lo, hi, out in self.local:
            index[out:out + hi - lo] = torch.arange(at, at + hi - lo)
            at += hi - lo
        for _, rows, ranges in self.recvs:
            for out, end, first in ranges:
                index[out:end] = torch.arange(at + first, at + first + end - out)
            at += rows
        return sent, own, index


def plan_earlier(positions: torch.Tensor, all_runs: list[list[tuple[int, int]]], rank: int,
                 reach: Callable[[int], int]) -> EarlierPlan:
    """Rank `rank`'s part of the exchange in which every rank receives, for each of its runs' first
    pieces that continue a document (row by row, runs in order: `Documents.continuations`' order), the
    `reach(start)` positions before the piece. `positions` `[B, N]`: each token's place in its document,
    of the whole rows (the same on every rank)."""
    return plan_reads(positions, all_runs, rank, lambda dst, row, a, start: [(start - reach(start), start)])


def plan_reads(positions: torch.Tensor, all_runs: list[list[tuple[int, int]]], rank: int,
               reads: Callable[[int, int, int, int], list[tuple[int, int]]]) -> EarlierPlan:
    """`plan_earlier` for any positions of the earlier part: `reads(dst, row, a, start)` gives, for rank
    `dst`'s piece of `row` whose run starts at row position `a` at position `start` of its document, the
    ranges `[lo, hi)` of the document (`hi <= start`, in order) whose inputs it receives, end to end. A
    position two pieces of a rank read travels once."""
    layout = RankLayout(all_runs)
    local, wanted, size = [], {}, 0
    for dst, runs in enumerate(all_runs):
        out = 0
        for row, starts in enumerate(continued_runs(positions, runs)):
            for (a, _), start in zip(runs, starts):
                for lo_doc, hi_doc in reads(dst, row, a, start) if start else []:
                    for src, column, lo, hi in layout.split(a - start + lo_doc, a - start + hi_doc):
                        if dst == rank == src:
                            local.append((row, column, column + hi - lo, out))
                        elif rank in (src, dst):
                            wanted.setdefault((src, dst), []).append((row, lo, hi, column, out))
                        out += hi - lo
        if dst == rank:
            size = out
    recvs, sends = [], []
    for (src, dst), parts in sorted(wanted.items()):
        unique = _merged([(row, lo, hi, column) for row, lo, hi, column, _ in parts])
        if src == rank:
            sends.append((dst, tuple((row, column, column + hi - lo) for row, lo, hi, column in unique)))
        else:
            firsts, at = [], 0
            for row, lo, hi, _ in unique:
                firsts.append(at)
                at += hi - lo
            ranges = []
            for row, lo, hi, _, out in parts:
                u = next(j for j, (r, ulo, uhi, _) in enumerate(unique) if r == row and ulo <= lo and hi <= uhi)
                ranges.append((out, out + hi - lo, firsts[u] + lo - unique[u][1]))
            recvs.append((src, at, tuple(ranges)))
    return EarlierPlan(size, tuple(local), tuple(recvs), tuple(sends), sum(b - a for a, b in all_runs[rank]))


def _merged(parts: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Segments `(row, lo, hi, column)` of one rank's positions (global `[lo, hi)` at its column `column`),
    sorted and merged where they overlap or touch in both the row and the rank's columns."""
    merged: list[list[int]] = []
    for row, lo, hi, column in sorted(parts):
        if merged and merged[-1][0] == row and lo <= merged[-1][2] and column - lo == merged[-1][3] - merged[-1][1]:
            merged[-1][2] = max(merged[-1][2], hi)
        else:
            merged.append([row, lo, hi, column])
    return [tuple(m) for m in merged]


def _flat_index(segments, columns: int) -> torch.Tensor:
    """The flat indices (`row * columns + column`) of segments `(row, lo, hi)`, in order."""
    parts = [torch.arange(row * columns + lo, row * columns + hi) for row, lo, hi in segments]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def gather_earlier(x: torch.Tensor, plan: EarlierPlan, transport: Transport) -> torch.Tensor:
    """This rank's part `x` `[B, n, ...]` -> `[plan.size, ...]`: the inputs each of its continuation pieces
    reads before it, laid end to end (differentiable: backward returns every gradient to its owner)."""
    if x.shape[1] != plan.columns:
        raise ValueError(f"gather_earlier got a part of {x.shape[1]} positions, the plan's rank holds {plan.columns}")
    flat = x.reshape(-1, *x.shape[2:])
    sent, own, index = (t.to(x.device, non_blocking=True) for t in plan.indices)
    sends = tuple((peer, sum(hi - lo for _, lo, hi in segments)) for peer, segments in plan.sends)
    received = exchange_rows(flat[sent], sends, tuple((peer, rows) for peer, rows, _ in plan.recvs), transport)
    return torch.cat((flat[own], received))[index]


def rank_documents(doc_ids: torch.Tensor, all_runs: list[list[tuple[int, int]]], rank: int,
                   device=None, positions: Optional[torch.Tensor] = None) -> Documents:
    """The `Documents` of rank `rank`'s runs of rows whose documents are `doc_ids` `[B, N]`, each run's first
    piece continued at its document's position (the runs laid end to end, each a piece of its own).
    `positions`: `document_positions(doc_ids)`, where the caller has them."""
    seq_len = max(b for runs in all_runs for _, b in runs)
    if doc_ids.dim() != 2 or doc_ids.shape[1] != seq_len:
        raise ValueError(f"doc_ids must be the whole rows [B, {seq_len}], got shape {tuple(doc_ids.shape)}")
    doc_ids, device = doc_ids.cpu(), doc_ids.device if device is None else device  # tables on the host
    runs = all_runs[rank]
    columns = [0]
    for a, b in runs[:-1]:
        columns.append(columns[-1] + b - a)
    part = torch.cat([doc_ids[:, a:b] for a, b in runs], dim=1)
    positions = document_positions(doc_ids) if positions is None else positions
    return Documents(part, continued=continued_runs(positions, runs), device=device, run_starts=columns)


class SequenceParallelDocuments(DocumentRows):
    """`DocumentRows` of one SP rank: its documents, and its continuation pieces' earlier inputs through
    `transport` (point-to-point messages over the group; a test hands in another)."""

    def __init__(self, doc_ids: torch.Tensor, all_runs: list[list[tuple[int, int]]], rank: int,
                 transport: Transport, device=None, block_size: Optional[int] = None):
        whole_positions = document_positions(doc_ids.cpu())
        super().__init__(rank_documents(doc_ids, all_runs, rank, device, whole_positions))
        self.all_runs, self.rank, self.transport = all_runs, rank, transport
        self.block_size = block_size  # FreeSolo's query block: its continued pieces receive their cells only
        self.whole_positions = whole_positions
        # the longest earlier part a piece reads on any rank (a window kind reads at most its window)
        self.width = max([start for runs in all_runs for row in continued_runs(self.whole_positions, runs)
                          for start in row], default=0)
        self.plans: dict = {}  # per key span: the exchanges' plans, built once per batch
        self.roots_plan: Optional[RootsPlan] = None

    def plan(self, span: Span) -> EarlierPlan:
        """This rank's exchange for a layer of key span `span`, built once per batch and reach."""
        window = span if isinstance(span, int) else None  # a window reads its last keys; the rest the prefix
        if window not in self.plans:
            self.plans[window] = plan_earlier(self.whole_positions, self.all_runs, self.rank,
                                              lambda start: reach_back(span, start))
        return self.plans[window]

    def earlier_tokens(self, x: torch.Tensor, span: Span) -> torch.Tensor:
        return gather_earlier(x, self.plan(span), self.transport)

    def continued_keys(self, x: torch.Tensor, span: Span, project, layer=None):
        if span is None and layer is not None and layer.routes_from_summaries and self.block_size is not None:
            return self._selected_keys(x, project, layer)
        if not isinstance(span, RetainedCells) or self.block_size is None:
            return super().continued_keys(x, span, project, layer)
        earlier, before, plan = self._region_inputs(x, ("retained", span), span, self.block_size)
        starts = [start for _, _, start in self.documents.continuations]
        # FS-L routes its pieces here from summaries, and holds compact keys, unless it scores token keys
        here = layer is not None and layer.routes_from_summaries and layer.router is None
        exchanged, keys = retained_keys(x, plan, before, starts, span, project, self.transport,
                                        RoutedHere(self.documents, layer) if here else None)
        return [earlier, *exchanged], keys

    def _selected_keys(self, x: torch.Tensor, project, layer):
        """FS's continued pieces: routed here from the holders' summaries, their selected cells only
        (`fsframework.parallel.document_selected`)."""
        cfg = layer.settings
        key = ("selected", cfg.block_size, cfg.cell_size, cfg.window)
        earlier, before, plan = self._region_inputs(x, key, region_span(cfg), cfg.block_size)
        exchanged, keys = selected_keys(x, plan, before, self.documents, layer, project, self.transport)
        return [earlier, *exchanged], keys

    def _region_inputs(self, x: torch.Tensor, key, span: RetainedCells, block_size: int):
        """A FreeSolo kind's continued pieces (`piece_cells` with `span`'s region): their region's and cut
        cells' inputs `[P, D]`, those cut per piece `[1, p, D]`, and the cells' plan, planned once per batch."""
        if key not in self.plans:
            layout, cells = RankLayout(self.all_runs), {}

            def cells_of(dst: int, row: int, a: int, start: int):  # each piece's cells, for both plans
                if (dst, row, a) not in cells:
                    cells[dst, row, a] = piece_cells(layout, span, block_size, row, a, start, dst)
                return cells[dst, row, a]

            reads = plan_reads(self.whole_positions, self.all_runs, self.rank,
                               lambda dst, row, a, start: cells_of(dst, row, a, start).reads)
            self.plans[key] = (reads, plan_retained(self.whole_positions, self.all_runs, self.rank, span,
                                                    block_size, cells_of))
        reads, plan = self.plans[key]
        earlier = gather_earlier(x, reads, self.transport)
        sizes = [sum(hi - lo for lo, hi in piece.reads) for piece in plan.own]
        return earlier, [part[None] for part in earlier.split(sizes)], plan

    def earlier_roots(self, h: torch.Tensor, combine):
        if self.roots_plan is None:
            self.roots_plan = plan_roots(self.whole_positions, self.all_runs, self.rank)
        return continued_roots(h, self.roots_plan, combine, self.transport)


def document_rows(sp: SPContext, doc_ids: torch.Tensor, device=None) -> SequenceParallelDocuments:
    """This rank's `SequenceParallelDocuments` of the sequence `sp` (either layout), its tables on `device`
    (the rows'; doc_ids' own by default)."""
    return SequenceParallelDocuments(doc_ids, sp.all_runs, sp.rank, partial(exchange, sp), device, sp.block_size)
