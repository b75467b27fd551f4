"""FS-L under document masking and sequence parallelism: a continued document's retained cells, not its prefix.

Legend: s cell size, P retained cells, W recent cells, w window, B query block, H heads, d head width.
Coordinates are the document's: a continued piece starts at its position `o`.

FS-L's query block reads the `w` keys before each query, the `W` cells before the block and the top-`P`
cells by the key-norm priority `a_c` (the largest key norm of the cell, per head; docs/freesolo.md §1.5)
of everything before the block. A continued piece's blocks start at `b0 = (o // B) B` and later, so of the
document's earlier part `[0, o)` they read:

1. the region `[r, o)`, `r = max(0, min(b0 - W s, o - w))` down to a cell: the recent cells, the window
   and the part of the piece's first block before `o`; its inputs travel (`plan_reads`), and the piece
   projects them itself, as for every kind;
2. of the complete cells before `r`, only the top `P` of `[0, r)` per head: a cell that `P` cells of
   `[0, r)` outrank is outranked by them in every longer prefix too (ties go to the earlier cell, as FS-L
   orders them). Each rank that holds such cells (whole, in one of its runs) projects them and sends its
   own best `min(P, its cells)` per head, their `a_c` and cell indices only, to the piece's rank and to
   the piece's other holders; all of them merge those tables alike into the top `P` of `[0, r)`, and
   each holder sends the keys and values of its cells among them. A cell that a rank's boundary cuts
   in two travels as inputs with the region.

The piece routes on its rank (`_routed_here`) from the summaries of what it holds, every other earlier
cell zero: a zero cell has `a_c = 0`, below every sent one, so FS-L's pruning keeps the single-process
cells and reads nothing else (the argument of `fsframework.parallel.retained`, whose unmasked exchange
this mirrors). Its keys are then compact (`fsframework.parallel.document_compact`): the cells its queries
read and the region, not its document's earlier length. Routing by the cells' token keys
(`route_score=tokens`) reads more than summaries: the piece then holds the zero prefix `[1, o, H, d]` with
those positions (per head for the sent cells), and the op routes over it. What travels per piece: the
region's inputs (`D` numbers a position), `P` pairs per head from each holder, and `P` cells per head,
whatever the document's length; backward returns each gradient to the rank whose inputs made it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fsframework.models.context import RetainedCells
from fsframework.ops.freesolo import summarize_cells
from fsframework.parallel.document_compact import compact_piece, piece_summaries, route_piece
from fsframework.parallel.rank_layout import RankLayout, Transport, continued_runs, exchange_rows, held_cells

Cell = tuple[int, int, int]  # (document cell index, row, first column on the rank that holds it)


@dataclass(frozen=True)
class PieceCells:
    """What one continued piece reads of its document's earlier part: the input ranges `reads` (document
    coordinates, in order: the cut cells, then the region) and, per rank that holds whole candidate
    cells, those cells in document order."""

    reads: tuple[tuple[int, int], ...]
    candidates: tuple[tuple[int, tuple[Cell, ...]], ...]  # (rank, its cells), ranks in order


def piece_cells(layout: RankLayout, span: RetainedCells, block_size: int, row: int, a: int, start: int,
                reader: int) -> PieceCells:
    """`PieceCells` of the piece of `row` whose run starts at row position `a`, at position `start` of its
    document, read by rank `reader` (a candidate cell `reader` holds itself travels as inputs too)."""
    s = span.cell_size
    first_block = start // block_size * block_size
    region = max(0, min(first_block - span.recent_cells * s, start - span.window)) // s * s
    doc_start = a - start
    cut, held = [], {}
    for cell in range(region // s):
        parts = layout.split(doc_start + cell * s, doc_start + (cell + 1) * s)
        rank, column, _, _ = parts[0]
        if len(parts) > 1 or rank == reader:
            cut.append((cell * s, (cell + 1) * s))
        else:
            held.setdefault(rank, []).append((cell, row, column))
    return PieceCells(tuple(cut) + ((region, start),), tuple((r, tuple(c)) for r, c in sorted(held.items())))


@dataclass(frozen=True)
class Piece:
    """A continued piece of rank `dst` (its `index`-th continuation) and what it reads (`PieceCells`)."""

    dst: int
    index: int
    cells: PieceCells
    document: tuple[int, int] = (0, 0)  # (row, the document's first row position): pieces of one document

    def holders(self) -> list[int]:
        return [rank for rank, _ in self.cells.candidates]


@dataclass(frozen=True)
class RetainedPlan:
    """One rank's part of the exchange of continued documents' retained cells (`plan_retained`): every
    continued piece it reads or holds candidate cells of, in one order all ranks share."""

    rank: int
    pieces: tuple[Piece, ...]

    @property
    def own(self) -> tuple[PieceCells, ...]:
        """This rank's pieces' `PieceCells`, in its `continuations` order."""
        return tuple(piece.cells for piece in self.pieces if piece.dst == self.rank)


def plan_retained(positions: torch.Tensor, all_runs: list[list[tuple[int, int]]], rank: int, span: RetainedCells,
                  block_size: int, cells_of=None) -> RetainedPlan:
    """Rank `rank`'s part, planned alike on every rank from the whole rows' document `positions` `[B, N]`.
    `cells_of(dst, row, a, start)`: the `piece_cells` of a piece, where a caller keeps them for its
    input plan too (`fsframework.parallel.documents`); by default computed here."""
    layout = RankLayout(all_runs)
    cells_of = cells_of or (lambda dst, row, a, start: piece_cells(layout, span, block_size, row, a, start, dst))
    pieces = []
    for dst, runs in enumerate(all_runs):
        index = 0
        for row, starts in enumerate(continued_runs(positions, runs)):
            for (a, _), start in zip(runs, starts):
                if not start:
                    continue
                piece = Piece(dst, index, cells_of(dst, row, a, start), (row, a - start))
                if dst == rank or rank in piece.holders():
                    pieces.append(piece)
                index += 1
    return RetainedPlan(rank, tuple(pieces))


def _best(priority: torch.Tensor, cells: torch.Tensor, top: int) -> torch.Tensor:
    """Indices `[top', H]` (`top' = min(top, M)`) of the `top` best of `priority`, `cells` `[M, H]` per head:
    `a_c` descending, the earlier cell first on ties (FS-L's order)."""
    by_cell = cells.argsort(dim=0, stable=True)
    by_priority = priority.gather(0, by_cell).argsort(dim=0, descending=True, stable=True)
    return by_cell.gather(0, by_priority)[:top]


class _Candidates:
    """What a rank holds for the pieces of `plan`: each piece's cells projected (keys, values `[C, s, H, d]`)
    and its own best `min(P, C)` per head as a table `[P', H, 2]` (a_c, document cell; float64)."""

    def __init__(self, x: torch.Tensor, plan: RetainedPlan, span: RetainedCells, project):
        s, top = span.cell_size, span.retained_cells
        self.held = {i: dict(piece.cells.candidates)[plan.rank] for i, piece in enumerate(plan.pieces)
                     if plan.rank in piece.holders()}
        cells = [cell for held in self.held.values() for cell in held]
        self.kv, self.tables, self.offsets = None, {}, {}
        if not cells:
            return
        k, v = held_cells(x, cells, s, project)
        self.kv = torch.cat((k, v), dim=-1)  # [C, s, H, 2d]
        at = 0
        with torch.no_grad():
            priority = torch.linalg.vector_norm(k.double(), dim=-1).amax(dim=1)  # [C, H]
            for i, held in self.held.items():
                ids = torch.tensor([cell for cell, _, _ in held], device=k.device)[:, None].expand(-1, k.shape[2])
                best = _best(priority[at:at + len(held)], ids, top)
                self.tables[i] = torch.stack((priority[at:at + len(held)].gather(0, best), ids.gather(0, best).double()),
                                             dim=-1)  # [P', H, 2]
                self.offsets[i] = at
                at += len(held)

    def rows_of(self, i: int, cells: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """Keys and values `[n, s, 2d]` of this rank's document cells `cells` `[n]` of piece `i`, heads `[n]`."""
        ids = torch.tensor([cell for cell, _, _ in self.held[i]], device=cells.device)  # ascending
        local = torch.searchsorted(ids, cells) + self.offsets[i]
        return self.kv[local, :, heads]


@dataclass(frozen=True)
class RoutedHere:
    """What routes an FS-L piece on its rank (`retained_keys`): the rank's `documents` (the pieces' tokens)
    and the FS-L `layer` (its settings and prior)."""

    documents: object
    layer: object


def _routed_here(q, k_in, k_own, region_kv, reads, sent, start: int, layer) -> tuple:
    """An FS-L piece routed on its rank from the summaries of what it holds (`piece_summaries`, the merged
    cells' from their keys; every other earlier cell is zero, as in the zero prefix, and FS-L never
    keeps one) -> its compact keys, values and cells (`compact_piece`)."""
    cfg, dim = layer.settings, q.shape[-1]
    with torch.no_grad():
        kbar, a = piece_summaries(k_in, k_own, reads, start, cfg)
        for cell, head, rows in sent:
            if cell.numel():
                kbar_cells, a_cells = summarize_cells(rows[..., :dim].reshape(1, -1, 1, dim), cfg)  # [1, 1, n, d]
                kbar[0, head, cell], a[0, head, cell] = kbar_cells[0, 0].to(kbar.dtype), a_cells[0, 0].to(a.dtype)
        cells = route_piece(q, kbar, a, start, layer)
    kv, cells = compact_piece(region_kv, reads, sent, cells, cfg.cell_size)
    return kv[None, ..., :dim], kv[None, ..., dim:], cells


def retained_keys(x: torch.Tensor, plan: RetainedPlan, earlier: list[torch.Tensor], starts: list[int],
                  span: RetainedCells, project, transport: Transport, routed: RoutedHere | None = None
                  ) -> tuple[list[torch.Tensor], list[tuple]]:
    """For each of this rank's continued pieces (`earlier[i]`: the inputs of its `reads`, `starts[i]` its
    position) its FS-L keys and values: with `routed`, routed here and compact, `(k, v, cells)`
    (`_routed_here`); else `[1, start, H, d]`, zero but the region, the cut cells and the document's top `P`
    cells of the rest per head, for the op to route (`model.attention.route_score=tokens`, which reads the
    cells' token keys). Two exchanges: each holder's best `P` per head (a_c and cell) to the piece's reader
    and other holders, which all merge them alike; then each holder's cells of the merged top `P`, keys and
    values, to the reader. Returns (what to tie the layer's output to; the keys)."""
    s, top, rank = span.cell_size, span.retained_cells, plan.rank
    _, probe, _ = project(x[:1, :0], 0)
    heads, width = probe.shape[2], 2 * probe.shape[3]
    held = _Candidates(x, plan, span, project)
    # 1. the candidate tables: from each holder to every other participant of the piece
    sends, recvs = {}, {}
    for i, piece in enumerate(plan.pieces):
        participants = [piece.dst, *piece.holders()]
        for holder, cells in piece.cells.candidates:
            rows = min(top, len(cells))
            for peer in participants:
                if holder == rank and peer != rank:
                    sends.setdefault(peer, []).append(i)
                elif peer == rank and holder != rank:
                    recvs.setdefault(holder, []).append((i, rows))
    with torch.no_grad():
        outgoing = [held.tables[i] for peer in sorted(sends) for i in sends[peer]]
        table = exchange_rows(torch.cat(outgoing) if outgoing else x.new_zeros(0, heads, 2, dtype=torch.float64),
                              tuple((peer, sum(held.tables[i].shape[0] for i in sends[peer])) for peer in sorted(sends)),
                              tuple((peer, sum(rows for _, rows in recvs[peer])) for peer in sorted(recvs)), transport)
    tables: dict[int, dict[int, torch.Tensor]] = {i: {} for i in range(len(plan.pieces))}
    at = 0
    for peer in sorted(recvs):
        for i, rows in recvs[peer]:
            tables[i][peer], at = table[at:at + rows], at + rows
    for i, t in held.tables.items():
        tables[i][rank] = t
    # 2. every participant merges a piece's tables alike: the document's top P per head, (holder, cell) pairs
    merged = {}
    for i, piece in enumerate(plan.pieces):
        holders = piece.holders()
        if not holders:
            continue
        both = torch.cat([tables[i][h] for h in holders])  # [M, H, 2]
        owner = torch.cat([torch.full((tables[i][h].shape[0],), h) for h in holders]).to(both.device)
        best = _best(both[..., 0], both[..., 1].long(), top)  # [P, H]
        head = torch.arange(heads, device=both.device).expand_as(best)
        # pairs in one order every rank takes: head by head, best first
        merged[i] = (owner[best].T.reshape(-1), both[..., 1].long().gather(0, best).T.reshape(-1), head.T.reshape(-1))
    # 3. the keys and values of the merged pairs, from their holders to the reader
    out_rows, send_counts, recv_counts = [], [], []
    for peer in range(max([p.dst for p in plan.pieces], default=-1) + 1):
        mine = [(i, (merged[i][0] == rank)) for i, piece in enumerate(plan.pieces)
                if piece.dst == peer and peer != rank and i in merged]
        rows = [held.rows_of(i, merged[i][1][pick], merged[i][2][pick]) for i, pick in mine if pick.any()]
        if mine:
            out_rows += rows
            send_counts.append((peer, sum(r.shape[0] for r in rows)))
    for holder in sorted({h for piece in plan.pieces if piece.dst == rank for h in piece.holders()}):
        recv_counts.append((holder, sum(int((merged[i][0] == holder).sum()) for i, piece in enumerate(plan.pieces)
                                        if piece.dst == rank and i in merged)))
    outgoing = torch.cat(out_rows) if out_rows else x.reshape(-1)[:0].view(0, s, width)
    received = exchange_rows(outgoing, tuple(send_counts), tuple(recv_counts), transport)
    # 4. each own piece's keys: compact where it is routed here, else a zero prefix holding what it reads
    at_holder = {holder: sum(count for h, count in recv_counts if h < holder) for holder, _ in recv_counts}
    keys = []
    own = [i for i, piece in enumerate(plan.pieces) if piece.dst == rank]
    for j, (i, before, start) in enumerate(zip(own, earlier, starts)):
        piece = plan.pieces[i]
        _, k_in, v_in = project(before, 0)  # FS-L's keys are unrotated: the position does not matter
        region_kv = torch.cat((k_in[0], v_in[0]), dim=-1)
        sent = []  # (document cells, heads, keys and values) of the merged cells, holder by holder
        if i in merged:
            owner, cell, head = merged[i]
            for holder in piece.holders():
                pick = owner == holder
                count = int(pick.sum())
                sent.append((cell[pick], head[pick], received[at_holder[holder]:at_holder[holder] + count]))
                at_holder[holder] += count
        if routed is not None:
            _, index, _ = routed.documents.continuations[j]
            q, k_own, _ = project(x.reshape(-1, x.shape[-1])[index][None], start)
            keys.append(_routed_here(q, k_in, k_own, region_kv, piece.cells.reads, sent, start, routed.layer))
            continue
        at_positions = torch.cat([torch.arange(lo, hi) for lo, hi in piece.cells.reads]).to(x.device)
        kv = torch.zeros(start, heads, width, dtype=k_in.dtype, device=x.device).index_put((at_positions,), region_kv)
        for cell, head, rows in sent:
            position = cell[:, None] * s + torch.arange(s, device=x.device)  # [n, s]
            kv = kv.index_put((position, head[:, None].expand_as(position)), rows)
        keys.append((kv[None, ..., :width // 2], kv[None, ..., width // 2:]))
    return [received], keys
