"""FS under document masking and sequence parallelism: a continued document's routing from summaries, its
selected cells only.

Legend: s cell size, K cells a query selects, w window, B query block, H heads, d head width. Coordinates
are the document's: a continued piece starts at its position `o`, its first query block at `b0 = (o // B) B`.

FS routes each query block over the summaries of every complete cell before it (the mean key and the
largest key norm per head, docs/freesolo.md §1.3-§1.4) and reads the selected cells' keys and values and
its window. So of the document's earlier part `[0, o)` a continued piece reads:

1. the region `[r, o)`, `r = max(0, min(b0, o - w))` down to a cell (its window and its first block's part
   before `o`), and the cells a rank's boundary cuts: their inputs travel, and the piece projects them
   (as every kind does: `plan_reads`, `fsframework.parallel.documents`);
2. of every other earlier cell, which lies whole on one rank: its summaries (`summarize_cells`, the
   implementation routing takes), from that rank; the piece routes on its own rank over them, the
   region's and its own cells (`select_cells_from_summaries`);
3. the keys and values of the cells it selected, per head: it sends each holder which of its cells
   (and heads) it selected, and the holder sends those.

The piece's keys are a zero prefix holding the region, the cut cells and the selected cells, with the
routed cells handed to the op (`ContinuedDocument` with cells): the op reads the window and the selected
cells only, so the logits are the one-process ones. What travels per piece: the region's inputs, `D + H`
numbers per earlier cell (its summaries: `1/s` of its inputs), one flag per cell and head, and the
selected cells. Backward returns the selected cells' and the region's gradients to their owners; routing
has none.
"""

from __future__ import annotations

import torch

from fsframework.models.context import RetainedCells
from fsframework.ops.freesolo import select_cells_from_summaries, summarize_cells
from fsframework.parallel.document_retained import RetainedPlan, plan_retained
from fsframework.parallel.rank_layout import Transport, cell_inputs, exchange_rows


def region_span(cfg) -> RetainedCells:
    """The span whose region (`fsframework.parallel.document_retained.piece_cells`) is FS's: the window and
    the first block, no recent cells."""
    return RetainedCells(cell_size=cfg.cell_size, recent_cells=0, retained_cells=0, window=cfg.window)


def plan_selected(positions: torch.Tensor, all_runs, rank: int, cfg) -> RetainedPlan:
    """The pieces rank `rank` reads or holds earlier cells of (`plan_retained` with FS's region)."""
    return plan_retained(positions, all_runs, rank, region_span(cfg), cfg.block_size)


def _held_cells(x: torch.Tensor, cells, project, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values `[C, s, H, d]` of a rank's cells `(cell, row, column)` of a piece, from its inputs."""
    inputs = cell_inputs(x, cells, s)  # [C, s, D]
    _, k, v = project(inputs.reshape(1, -1, x.shape[-1]), 0)
    return k.reshape(len(cells), s, *k.shape[2:]), v.reshape(len(cells), s, *v.shape[2:])


def selected_keys(x: torch.Tensor, plan: RetainedPlan, earlier: list[torch.Tensor], documents, layer, project,
                  transport: Transport) -> tuple[list[torch.Tensor], list[tuple]]:
    """For each of this rank's continued pieces (`earlier[i]`: the inputs of its `reads`) its FS keys and
    values `[1, o, H, d]` (zero but what its cells read) and its routed cells `[1, pad + m, H, K]` (module
    docstring). `documents`: this rank's (`continuations`: the pieces' tokens and positions); `layer` the
    FS layer (settings, prior). Returns (what to tie the layer's output to; (k, v, cells) per piece)."""
    cfg, rank = layer.settings, plan.rank
    s, block = cfg.cell_size, cfg.block_size
    _, probe, _ = project(x[:1, :0], 0)
    heads, dim = probe.shape[2], probe.shape[3]
    held = {i: dict(piece.cells.candidates)[rank] for i, piece in enumerate(plan.pieces)
            if rank in piece.holders()}
    projected = {i: _held_cells(x, cells, project, s) for i, cells in held.items()}
    # 1. the holders' summaries of their cells, to the piece's rank: kbar and a per cell and head
    with torch.no_grad():
        summaries = {}
        for i, (k, _) in projected.items():
            kbar, a = summarize_cells(k.reshape(1, -1, heads, dim), cfg)  # [1, H, C, d], [1, H, C]
            summaries[i] = torch.cat((kbar[0], a[0, ..., None].to(kbar.dtype)), dim=-1).transpose(0, 1)  # [C, H, d+1]
        sends = _by_reader(plan, rank, held)
        recvs = _by_holder(plan, rank, lambda piece, cells: len(cells))
        like = torch.empty(0, heads, dim + 1, dtype=_summary_dtype(probe), device=x.device)
        gathered = exchange_rows(_cat([summaries[i] for _, pieces in sends for i in pieces], like),
                                 _counts(sends, lambda i: summaries[i].shape[0]), _recv_counts(recvs), transport)
    # 2. each own piece routes over every cell before its blocks: the holders', the region's and its own
    own = [i for i, piece in enumerate(plan.pieces) if piece.dst == rank]
    routed, flags, at = [], {}, _recv_offsets(recvs)
    for n, (i, before) in enumerate(zip(own, earlier)):
        piece = plan.pieces[i]
        _, index, start = documents.continuations[n]
        q, k_own, _ = project(x.reshape(-1, x.shape[-1])[index][None], start)
        _, k_in, v_in = project(before, 0)  # FS's keys are unrotated: the position does not matter
        at_positions = torch.cat([torch.arange(lo, hi) for lo, hi in piece.cells.reads]).to(x.device)
        kv = x.new_zeros(start, heads, 2 * dim, dtype=k_in.dtype).index_put(
            (at_positions,), torch.cat((k_in[0], v_in[0]), dim=-1))
        with torch.no_grad():
            kbar, a = summarize_cells(torch.cat((kv[None, ..., :dim], k_own), dim=1), cfg)  # [1, H, C, d]
            for holder, cells in piece.cells.candidates:
                ids, count = _ids(cells, x.device), len(cells)
                rows = gathered[at[holder]:at[holder] + count]  # [C, H, d+1]
                at[holder] += count
                kbar[0, :, ids] = rows[..., :dim].transpose(0, 1).to(kbar.dtype)
                a[0, :, ids] = rows[..., dim].transpose(0, 1).to(a.dtype)
            pad = start % block
            q_pad = torch.cat((q.new_zeros(1, pad, heads, dim), q), dim=1)
            cells = select_cells_from_summaries(q_pad, kbar, a, cfg, layer.prior, q_start=start - pad)
            # which of each holder's cells (and heads) some query selected: [C, H] flags
            picked = torch.zeros(a.shape[-1], heads, dtype=torch.bool, device=x.device)
            chosen = cells[0].permute(1, 0, 2).reshape(heads, -1)  # [H, queries K]
            valid = chosen >= 0
            picked[chosen[valid], torch.arange(heads, device=x.device)[:, None].expand_as(chosen)[valid]] = True
            for holder, held_cells in piece.cells.candidates:
                flags[i, holder] = picked[_ids(held_cells, x.device)]
        routed.append((kv, cells))
    # 3. the flags to the holders, then the selected cells' keys and values back
    with torch.no_grad():
        flag_sends = _by_holder(plan, rank, lambda piece, cells: len(cells))  # reader -> holder: one row a cell
        asked = exchange_rows(_cat([flags[i, holder].to(torch.uint8) for holder, pieces in flag_sends
                                    for i, _ in pieces], torch.empty(0, heads, dtype=torch.uint8, device=x.device)),
                              _recv_counts(flag_sends), _counts(sends, lambda i: len(held[i])), transport).bool()
    outgoing, counts, at_flag = [], [], 0
    for peer, pieces in sends:
        total = 0
        for i in pieces:
            mine = asked[at_flag:at_flag + len(held[i])]  # [C, H]
            at_flag += len(held[i])
            cell, head = mine.nonzero(as_tuple=True)
            k, v = projected[i]
            outgoing.append(torch.cat((k[cell, :, head], v[cell, :, head]), dim=-1))  # [n, s, 2d]
            total += cell.numel()
        counts.append((peer, total))
    expected = [(holder, sum(int(flags[i, holder].sum()) for i, _ in pieces)) for holder, pieces in flag_sends]
    received = exchange_rows(_cat(outgoing, x.reshape(-1)[:0].view(0, s, 2 * dim)), tuple(counts), tuple(expected),
                             transport)
    # 4. the selected cells in each piece's zero prefix
    keys, at_cell = [], {holder: sum(c for h, c in expected if h < holder) for holder, _ in expected}
    for i, (kv, cells) in zip(own, routed):
        for holder, held_cells in plan.pieces[i].cells.candidates:
            cell, head = flags[i, holder].nonzero(as_tuple=True)
            rows = received[at_cell[holder]:at_cell[holder] + cell.numel()]
            at_cell[holder] += cell.numel()
            position = _ids(held_cells, x.device)[cell][:, None] * s + torch.arange(s, device=x.device)
            kv = kv.index_put((position, head[:, None].expand_as(position)), rows)
        keys.append((kv[None, ..., :dim], kv[None, ..., dim:], cells))
    return [gathered, received], keys


def _ids(cells, device) -> torch.Tensor:
    """The document cell indices of a holder's cells `(cell, row, column)`, in order."""
    return torch.tensor([cell for cell, _, _ in cells], dtype=torch.long, device=device)


def _summary_dtype(k: torch.Tensor) -> torch.dtype:
    return torch.promote_types(k.dtype, torch.float32)


def _cat(parts: list[torch.Tensor], empty: torch.Tensor) -> torch.Tensor:
    return torch.cat(parts) if parts else empty


def _by_reader(plan: RetainedPlan, rank: int, held: dict) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The pieces this rank holds cells of (`held`), grouped by their reader (readers in order, pieces in order)."""
    out: dict[int, list[int]] = {}
    for i, piece in enumerate(plan.pieces):
        if i in held and piece.dst != rank:
            out.setdefault(piece.dst, []).append(i)
    return tuple((p, tuple(pieces)) for p, pieces in sorted(out.items()))


def _by_holder(plan: RetainedPlan, rank: int, size) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """This rank's pieces grouped by the ranks holding their cells: `(holder, ((piece, rows), ...))`."""
    out: dict[int, list[tuple[int, int]]] = {}
    for i, piece in enumerate(plan.pieces):
        if piece.dst != rank:
            continue
        for holder, cells in piece.cells.candidates:
            out.setdefault(holder, []).append((i, size(piece, cells)))
    return tuple((h, tuple(pieces)) for h, pieces in sorted(out.items()))


def _counts(sends, size) -> tuple[tuple[int, int], ...]:
    return tuple((peer, sum(size(i) for i in pieces)) for peer, pieces in sends)


def _recv_counts(recvs) -> tuple[tuple[int, int], ...]:
    return tuple((holder, sum(rows for _, rows in pieces)) for holder, pieces in recvs)


def _recv_offsets(recvs) -> dict[int, int]:
    """Where each holder's rows begin in a message laid out holder by holder."""
    offsets, at = {}, 0
    for holder, pieces in recvs:
        offsets[holder] = at
        at += sum(rows for _, rows in pieces)
    return offsets

