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

The piece's keys are compact (`compact_piece`, as the unmasked exchange's, `fsframework.parallel.compact`):
per head the earlier cells its queries selected, then the region whole, with the routed cells re-indexed
into them and handed to the op (`ContinuedDocument` with cells). The op reads the window and the selected
cells only, and the readout is position-free, so the logits are the one-process ones, while the piece
holds `O(K s` per query block `+ o - r)` positions, not its document's earlier length `o`; its routing
reads the summaries alone (`1/s` of the keys), built cell by cell without a prefix-long tensor. What
travels per piece: the region's inputs, `D + H` numbers per earlier cell (its summaries: `1/s` of its
inputs), one flag per cell and head, and the selected cells. Backward returns the selected cells' and the
region's gradients to their owners; routing has none.
"""

from __future__ import annotations

import torch

from fsframework.models.context import RetainedCells
from fsframework.ops.freesolo import summarize_cells
from fsframework.parallel.document_retained import RetainedPlan, plan_retained
from fsframework.parallel.document_compact import compact_piece, piece_summaries, route_piece
from fsframework.parallel.rank_layout import Transport, exchange_rows, held_cells


def region_span(cfg) -> RetainedCells:
    """The span whose region (`fsframework.parallel.document_retained.piece_cells`) is FS's: the window and
    the first block, no recent cells."""
    return RetainedCells(cell_size=cfg.cell_size, recent_cells=0, retained_cells=0, window=cfg.window)


def plan_selected(positions: torch.Tensor, all_runs, rank: int, cfg, cells_of=None) -> RetainedPlan:
    """The pieces rank `rank` reads or holds earlier cells of (`plan_retained` with FS's region)."""
    return plan_retained(positions, all_runs, rank, region_span(cfg), cfg.block_size, cells_of)


def _groups(plan: RetainedPlan) -> list[list[int]]:
    """The pieces of `plan` grouped by reader and document, each group in position order: a rank's later
    piece of a document reads every earlier cell its earlier pieces read (each holder's cells of an earlier
    piece are the first of the later one's), so a group's cells travel once, as its last piece's."""
    groups: dict[tuple, list[int]] = {}
    for i, piece in enumerate(plan.pieces):
        groups.setdefault((piece.dst, piece.document), []).append(i)
    return list(groups.values())


def selected_keys(x: torch.Tensor, plan: RetainedPlan, earlier: list[torch.Tensor], documents, layer, project,
                  transport: Transport) -> tuple[list[torch.Tensor], list[tuple]]:
    """For each of this rank's continued pieces (`earlier[i]`: the inputs of its `reads`) its FS keys and
    values, compact (`compact_piece`: the cells its queries read, then its region), and its routed cells
    `[1, pad + m, H, K]` indexing them (module docstring). `documents`: this rank's (`continuations`: the
    pieces' tokens and positions); `layer` the FS layer (settings, prior). The pieces of one document on
    this rank share one exchange (`_groups`). Returns (what to tie the layer's output to; (k, v, cells) per
    piece)."""
    cfg, rank = layer.settings, plan.rank
    s = cfg.cell_size
    _, probe, _ = project(x[:1, :0], 0)
    heads, dim = probe.shape[2], probe.shape[3]
    groups = _groups(plan)
    last = {tuple(g): plan.pieces[g[-1]] for g in groups}
    # the groups this rank holds cells of (for another rank) and the groups it reads with their holders
    held = {tuple(g): dict(last[tuple(g)].cells.candidates)[rank] for g in groups
            if rank in last[tuple(g)].holders() and last[tuple(g)].dst != rank}
    reading = [(tuple(g), last[tuple(g)].cells.candidates) for g in groups if last[tuple(g)].dst == rank]
    projected = {g: held_cells(x, cells, s, project) for g, cells in held.items()}
    # 1. the holders' summaries of their cells, to the reader: kbar and a per cell and head
    sends = _by_reader(held, last)
    recvs = _by_holder(reading)
    sizes = dict(_reading_cells(reading))
    with torch.no_grad():
        summaries = {}
        for g, (k, _) in projected.items():
            kbar, a = summarize_cells(k.reshape(1, -1, heads, dim), cfg)  # [1, H, C, d], [1, H, C]
            summaries[g] = torch.cat((kbar[0], a[0, ..., None].to(kbar.dtype)), dim=-1).transpose(0, 1)  # [C, H, d+1]
        like = torch.empty(0, heads, dim + 1, dtype=_summary_dtype(probe), device=x.device)
        gathered = exchange_rows(_cat([summaries[g] for _, gs in sends for g in gs], like),
                                 _held_counts(sends, held), _read_counts(recvs, sizes), transport)
    offsets = _offsets(recvs, sizes)
    # 2. each own piece routes over every cell before its blocks: the holders', the region's and its own
    own = [i for i, piece in enumerate(plan.pieces) if piece.dst == rank]
    slot = {i: n for n, i in enumerate(own)}
    routed, flags = {}, {}
    for g, candidates in reading:
        union = {holder: torch.zeros(len(cells), heads, dtype=torch.bool, device=x.device) for holder, cells in candidates}
        for i in g:
            piece, before = plan.pieces[i], earlier[slot[i]]
            _, index, start = documents.continuations[slot[i]]
            q, k_own, _ = project(x.reshape(-1, x.shape[-1])[index][None], start)
            _, k_in, v_in = project(before, 0)  # FS's keys are unrotated: the position does not matter
            with torch.no_grad():
                kbar, a = piece_summaries(k_in, k_own, piece.cells.reads, start, cfg)
                for holder, cells in piece.cells.candidates:  # the first cells of the group's holder's
                    rows = gathered[offsets[g, holder]:offsets[g, holder] + len(cells)]  # [C, H, d+1]
                    ids = _ids(cells, x.device)
                    kbar[0, :, ids] = rows[..., :dim].transpose(0, 1).to(kbar.dtype)
                    a[0, :, ids] = rows[..., dim].transpose(0, 1).to(a.dtype)
                cells = route_piece(q, kbar, a, start, layer)
                # which of each holder's cells (and heads) some query selected: [C, H] flags
                picked = torch.zeros(a.shape[-1], heads, dtype=torch.bool, device=x.device)
                chosen = cells[0].permute(1, 0, 2).reshape(heads, -1)  # [H, queries K]
                valid = chosen >= 0
                picked[chosen[valid], torch.arange(heads, device=x.device)[:, None].expand_as(chosen)[valid]] = True
                for holder, holder_cells in piece.cells.candidates:
                    flags[i, holder] = picked[_ids(holder_cells, x.device)]
                    union[holder][:len(holder_cells)] |= flags[i, holder]
            routed[i] = (torch.cat((k_in[0], v_in[0]), dim=-1), cells)
        for holder, _ in candidates:
            flags[g, holder] = union[holder]
    # 3. each group's flags (the union of its pieces') to the holders, then those cells' keys and values back
    with torch.no_grad():
        asked = exchange_rows(_cat([flags[g, holder].to(torch.uint8) for holder, gs in recvs for g in gs],
                                   torch.empty(0, heads, dtype=torch.uint8, device=x.device)),
                              _read_counts(recvs, sizes), _held_counts(sends, held), transport).bool()
    outgoing, counts, at = [], [], 0
    for peer, gs in sends:
        total = 0
        for g in gs:
            mine = asked[at:at + len(held[g])]  # [C, H]
            at += len(held[g])
            cell, head = mine.nonzero(as_tuple=True)
            k, v = projected[g]
            outgoing.append(torch.cat((k[cell, :, head], v[cell, :, head]), dim=-1))  # [n, s, 2d]
            total += cell.numel()
        counts.append((peer, total))
    expected = [(holder, sum(int(flags[g, holder].sum()) for g in gs)) for holder, gs in recvs]
    received = exchange_rows(_cat(outgoing, x.reshape(-1)[:0].view(0, s, 2 * dim)), tuple(counts), tuple(expected),
                             transport)
    # 4. each piece's compact keys: the cells its queries read, then its region
    first_row, at = {}, 0
    for holder, gs in recvs:
        for g in gs:
            first_row[g, holder], at = at, at + int(flags[g, holder].sum())
    keys = []
    for i in own:
        region_kv, cells = routed[i]
        g = next(g for g, _ in reading if i in g)
        sent = []  # (cells, heads, rows) from each holder
        for holder, holder_cells in plan.pieces[i].cells.candidates:
            union = flags[g, holder]
            order = union.reshape(-1).long().cumsum(0).view(union.shape) - 1  # a flagged pair's row in the message
            cell, head = flags[i, holder].nonzero(as_tuple=True)
            sent.append((_ids(holder_cells, x.device)[cell], head, received[first_row[g, holder] + order[cell, head]]))
        kv, cells = compact_piece(region_kv, plan.pieces[i].cells.reads, sent, cells, s)
        keys.append((kv[None, ..., :dim], kv[None, ..., dim:], cells))
    return [gathered, received], keys


def _ids(cells, device) -> torch.Tensor:
    """The document cell indices of a holder's cells `(cell, row, column)`, in order."""
    return torch.tensor([cell for cell, _, _ in cells], dtype=torch.long, device=device)


def _summary_dtype(k: torch.Tensor) -> torch.dtype:
    return torch.promote_types(k.dtype, torch.float32)


def _cat(parts: list[torch.Tensor], empty: torch.Tensor) -> torch.Tensor:
    return torch.cat(parts) if parts else empty


def _by_reader(held: dict, last: dict) -> tuple[tuple[int, tuple[tuple, ...]], ...]:
    """The groups this rank holds cells of, by their reader (readers in order, groups in plan order)."""
    out: dict[int, list[tuple]] = {}
    for g in held:
        out.setdefault(last[g].dst, []).append(g)
    return tuple((peer, tuple(gs)) for peer, gs in sorted(out.items()))


def _by_holder(reading) -> tuple[tuple[int, tuple[tuple, ...]], ...]:
    """The groups this rank reads, by the ranks holding their cells (holders in order, groups in plan order)."""
    out: dict[int, list[tuple]] = {}
    for g, candidates in reading:
        for holder, _ in candidates:
            out.setdefault(holder, []).append(g)
    return tuple((h, tuple(gs)) for h, gs in sorted(out.items()))


def _reading_cells(reading):
    """`((group, holder), cell count)` of the groups this rank reads."""
    return [((g, holder), len(cells)) for g, candidates in reading for holder, cells in candidates]


def _held_counts(sends, held: dict) -> tuple[tuple[int, int], ...]:
    """Rows per reader of the groups this rank holds cells of: one per cell."""
    return tuple((peer, sum(len(held[g]) for g in gs)) for peer, gs in sends)


def _read_counts(recvs, sizes: dict) -> tuple[tuple[int, int], ...]:
    """Rows per holder of the groups this rank reads: `sizes[group, holder]`, one per cell."""
    return tuple((holder, sum(sizes[g, holder] for g in gs)) for holder, gs in recvs)


def _offsets(recvs, sizes: dict) -> dict:
    """Where each (group, holder)'s rows begin in a message laid out holder by holder, groups in order."""
    offsets, at = {}, 0
    for holder, gs in recvs:
        for g in gs:
            offsets[g, holder], at = at, at + sizes[g, holder]
    return offsets
