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
2. of the complete cells before `r`, only those in the top `P` of `[0, r)` for some head: a cell that
   `P` cells of `[0, r)` outrank is outranked by them in every longer prefix too (ties go to the earlier
   cell, as FS-L orders them). So each rank that holds such cells (whole, in one of its runs) projects
   them, takes its own top `min(P, its cells)` per head and sends their keys and values with their cell
   indices: the union holds the top `P` of `[0, r)`. A cell that a rank's boundary cuts in two travels
   as inputs with the region.

The piece's keys are then a zero prefix `[1, o, H, d]` holding those positions (per head for the sent
cells): a zero cell has `a_c = 0`, below every sent one, so FS-L's pruning keeps the single-process cells
and reads nothing else (the argument of `fsframework.parallel.retained`, whose unmasked exchange this
mirrors). What travels per piece: the region's inputs (`D` numbers a position) and at most `P` cells
per head from each rank holding a part of the document, whatever its length; backward returns each
gradient to the rank whose inputs made it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fsframework.models.context import RetainedCells
from fsframework.parallel.rank_layout import RankLayout, Transport, continued_runs, exchange_rows

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
class RetainedPlan:
    """One rank's part of the exchange of continued documents' retained cells (`plan_retained`).

    `own`: this rank's pieces' `PieceCells`, in `continuations` order; `jobs[peer]`: the pieces of `peer`
    for which this rank holds candidate cells, each its cells (this rank sends `min(P, len)` per head for
    each); `recvs[peer]`: how many cells per head `peer` sends this rank for each of its pieces, in order
    (`(piece index, count)`)."""

    own: tuple[PieceCells, ...]
    jobs: tuple[tuple[int, tuple[tuple[Cell, ...], ...]], ...]
    recvs: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]


def plan_retained(positions: torch.Tensor, all_runs: list[list[tuple[int, int]]], rank: int, span: RetainedCells,
                  block_size: int) -> RetainedPlan:
    """Rank `rank`'s part, planned alike on every rank from the whole rows' document `positions` `[B, N]`."""
    layout = RankLayout(all_runs)
    own, jobs, recvs = [], {}, {}
    for dst, runs in enumerate(all_runs):
        index = 0
        for row, starts in enumerate(continued_runs(positions, runs)):
            for (a, _), start in zip(runs, starts):
                if not start:
                    continue
                cells = piece_cells(layout, span, block_size, row, a, start, dst)
                if dst == rank:
                    own.append(cells)
                for src, held in cells.candidates:
                    if src == rank:
                        jobs.setdefault(dst, []).append(held)
                    elif dst == rank:
                        recvs.setdefault(src, []).append((index, min(span.retained_cells, len(held))))
                index += 1
    return RetainedPlan(tuple(own), tuple((p, tuple(j)) for p, j in sorted(jobs.items())),
                        tuple((p, tuple(r)) for p, r in sorted(recvs.items())))


def _top_cells(k: torch.Tensor, top: int) -> torch.Tensor:
    """Indices `[top, H]` of the `top` cells of keys `k` `[C, s, H, d]` (cells in document order) with the
    largest `a_c` per head, the earlier cell first on ties (FS-L's order)."""
    priority = torch.linalg.vector_norm(k.float() if k.dtype in (torch.float16, torch.bfloat16) else k,
                                        dim=-1).amax(dim=1)  # [C, H]
    return priority.argsort(dim=0, descending=True, stable=True)[:top]


def send_cells(x: torch.Tensor, plan: RetainedPlan, span: RetainedCells, project) -> tuple[torch.Tensor, torch.Tensor,
                                                                                          list[tuple[int, int]]]:
    """This rank's top cells for its peers' pieces: (keys and values `[M, s, 2d]` rows of one cell and head,
    their document cell indices `[M]`, `(peer, rows)` per peer in order). `project(x, start) -> q, k, v`."""
    s = span.cell_size
    cells = [cell for _, pieces in plan.jobs for held in pieces for cell in held]
    if not cells:  # nothing to send: still a slice of `x`, so that the exchange's backward runs here too
        _, probe, _ = project(x[:1, :0], 0)
        return x.reshape(-1)[:0].view(0, s, 2 * probe.shape[-1]), torch.zeros(0, dtype=torch.long), []
    inputs = torch.stack([x[row, column:column + s] for _, row, column in cells])  # [C, s, D]
    _, k, v = project(inputs.reshape(1, -1, x.shape[-1]), 0)
    k, v = (t.reshape(len(cells), s, *t.shape[2:]) for t in (k, v))  # [C, s, H, d]
    heads = torch.arange(k.shape[2], device=k.device)
    values, indices, sends, at = [], [], [], 0
    for peer, pieces in plan.jobs:
        rows = 0
        for held in pieces:
            top = min(span.retained_cells, len(held))
            best = _top_cells(k[at:at + len(held)], top) + at  # [top, H] into the stacked cells
            kv = torch.cat((k[best, :, heads], v[best, :, heads]), dim=-1)  # [top, H, s, 2d]
            values.append(kv.reshape(-1, s, kv.shape[-1]))
            document_cells = torch.tensor([cell for cell, _, _ in held], device=best.device)
            indices.append(document_cells[best - at].reshape(-1))
            rows += top * k.shape[2]
            at += len(held)
        sends.append((peer, rows))
    return torch.cat(values), torch.cat(indices).cpu(), sends


def retained_keys(x: torch.Tensor, plan: RetainedPlan, earlier: list[torch.Tensor], starts: list[int],
                  span: RetainedCells, project, transport: Transport
                  ) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """For each of this rank's continued pieces (`earlier[i]`: the inputs of its `reads`, `starts[i]` its
    position) its FS-L keys and values `[1, start, H, d]`: zero but the region, the cut cells and the cells
    the peers sent (module docstring). Returns (the exchanged values, to tie the layer's output to; keys)."""
    s = span.cell_size
    heads = project(x[:1, :0], 0)[1].shape[2]
    values, indices, sends = send_cells(x, plan, span, project)
    recvs = tuple((peer, sum(count for _, count in pieces) * heads) for peer, pieces in plan.recvs)
    received = exchange_rows(values, tuple(sends), recvs, transport)
    with torch.no_grad():
        cells = exchange_rows(indices, tuple(sends), recvs, transport)
    # the received rows of each piece: (first row, cells per head), peers in order, each peer's pieces in order
    parts: dict[int, list[tuple[int, int]]] = {}
    at = 0
    for _, pieces in plan.recvs:
        for piece, count in pieces:
            parts.setdefault(piece, []).append((at, count))
            at += count * heads
    keys = []
    for i, (piece, before, start) in enumerate(zip(plan.own, earlier, starts)):
        _, k_in, v_in = project(before, 0)  # FS-L's keys are unrotated: the position does not matter
        at_positions = torch.cat([torch.arange(lo, hi) for lo, hi in piece.reads]).to(x.device)
        kv = torch.zeros(start, heads, 2 * k_in.shape[-1], dtype=k_in.dtype, device=x.device)
        kv = kv.index_put((at_positions,), torch.cat((k_in[0], v_in[0]), dim=-1))
        for first, count in parts.get(i, []):
            rows = received[first:first + count * heads].view(count, heads, s, -1)
            cell = cells[first:first + count * heads].view(count, heads).to(x.device)
            position = cell[..., None] * s + torch.arange(s, device=x.device)  # [count, H, s]
            head = torch.arange(heads, device=x.device)[None, :, None].expand_as(position)
            kv = kv.index_put((position, head), rows)
        keys.append((kv[None, ..., :k_in.shape[-1]], kv[None, ..., k_in.shape[-1]:]))
    return [received], keys
