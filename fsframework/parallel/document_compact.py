"""A continued FreeSolo piece's keys under document masking and sequence parallelism, compact.

Legend: s cell size, K cells a query selects, o the piece's position in its document, r its region's start
(`fsframework.parallel.document_retained.piece_cells`), H heads, d head width.

A piece that is routed on its own rank (FS: `fsframework.parallel.document_selected`; FS-L:
`fsframework.parallel.document_retained`) knows which earlier cells its queries read. Its rank then holds,
as unmasked sequence parallelism does (`fsframework.parallel.compact`), per head those cells before the
region, then the region `[r, o)` whole (the window reads its last positions before the piece's own keys),
with the cells re-indexed into that tensor: `O(K s` a query block `+ o - r)` positions, not `o`. Its routing
reads the cells' summaries, built here cell by cell from what the rank holds, the holders' cells filled in
by the caller.
"""

from __future__ import annotations

import torch

from fsframework.ops.freesolo import select_cells_from_summaries, summarize_cells
from fsframework.parallel.compact import cells_read


def piece_summaries(k_in: torch.Tensor, k_own: torch.Tensor, reads, start: int, cfg):
    """The summaries (kbar `[1, H, C, d]`, a `[1, H, C]`, `C = (start + m) // s`) of a piece's cells that
    its own rank holds: the cut cells and the region (`k_in` `[1, R, H, d]`, the inputs of `reads`
    projected) and its own keys `k_own` `[1, m, H, d]`; the holders' cells are left zero for their
    summaries. Each complete cell is summarized from its own keys, so no prefix-long tensor is built."""
    s = cfg.cell_size
    region = reads[-1][0]
    cut = k_in.shape[1] - (start - region)  # the cut cells' positions come first, whole cells each
    tail_kbar, tail_a = summarize_cells(torch.cat((k_in[:, cut:], k_own), dim=1), cfg)  # cells from region // s
    total = (start + k_own.shape[1]) // s
    kbar = tail_kbar.new_zeros((1, tail_kbar.shape[1], total, tail_kbar.shape[-1]))
    a = tail_a.new_zeros((1, tail_a.shape[1], total))
    kbar[:, :, region // s:], a[:, :, region // s:] = tail_kbar, tail_a
    if cut:
        cut_kbar, cut_a = summarize_cells(k_in[:, :cut], cfg)
        ids = _cut_cells(reads, s, k_in.device)
        kbar[:, :, ids], a[:, :, ids] = cut_kbar, cut_a
    return kbar, a


def route_piece(q: torch.Tensor, kbar: torch.Tensor, a: torch.Tensor, start: int, layer) -> torch.Tensor:
    """A continued piece's cells `[1, pad + m, H, K]` (document cells) from its summaries (`piece_summaries`
    with the holders' filled in): its queries q `[1, m, H, d]` at `start`, front-padded with zero queries
    back to their block's start (routing takes block-aligned offsets; the op drops the padded rows'
    outputs), routed with the layer's settings and prior. No gradient."""
    cfg = layer.settings
    pad = start % cfg.block_size
    q_pad = torch.cat((q.new_zeros(1, pad, *q.shape[2:]), q), dim=1)
    return select_cells_from_summaries(q_pad, kbar, a, cfg, layer.prior, q_start=start - pad)


def _cut_cells(reads, s: int, device) -> torch.Tensor:
    """The document cells of a piece's cut-cell reads (every read but the last, the region), in order."""
    return torch.tensor([cell for lo, hi in reads[:-1] for cell in range(lo // s, hi // s)], dtype=torch.long,
                        device=device)


def compact_piece(region_kv: torch.Tensor, reads, sent: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                  cells: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A continued piece's keys and values, compact, and its cells re-indexed into them.

    region_kv `[R, H, 2d]`: the inputs of `reads` projected (the cut cells, then the region `[r, o)`);
    sent: per holder (document cells `[n]`, heads `[n]`, keys and values `[n, s, 2d]`) of cells before `r`,
    those its queries selected among them; cells `[1, pad + m, H, K]` (document cells, -1 none). Returns
    `[c s + o - r, H, 2d]`: per head the cells before `r` that its queries read, in cell order, padded to
    the most any head reads (`c` cells), then the region whole; and the cells as indices into it. The
    readout is position-free (NoPE) and the window reads the region's last positions before the piece's own
    keys, so both read what they read in the document's zero prefix, but the piece holds `O(c s + o - r)`
    positions, not `O(o)`."""
    region = reads[-1][0]
    cut = region_kv.shape[0] - (reads[-1][1] - region)  # the cut cells' positions, before the region
    early = region // s
    heads, width = region_kv.shape[1], region_kv.shape[2]
    read = cells_read(cells, early)[0]  # [H, early]: the early cells some query reads
    slot_of = read.long().cumsum(-1) - 1
    num_slots = int(read.sum(-1).max()) if early else 0
    slots = region_kv.new_zeros((num_slots * s, heads, width))
    offsets = torch.arange(s, device=cells.device)

    def place(slots, cell, head, rows):  # rows [n, s, 2d] of (cell, head) into their slots
        position = slot_of[head, cell][:, None] * s + offsets
        return slots.index_put((position, head[:, None].expand_as(position)), rows)

    if cut:  # the cut cells its queries read, from the inputs
        ids = _cut_cells(reads, s, cells.device)
        head, which = read[:, ids].nonzero(as_tuple=True)
        rows = region_kv[:cut].view(-1, s, heads, width)[which, :, head]
        slots = place(slots, ids[which], head, rows)
    for cell, head, rows in sent:  # the holders' cells (all before the region) its queries read
        if cell.numel():
            keep = read[head, cell]  # FS sends only those; FS-L's merged top P, some
            slots = place(slots, cell[keep], head[keep], rows[keep])
    if early:
        head = torch.arange(heads, device=cells.device).view(1, 1, -1, 1)
        in_slots = slot_of[head.expand_as(cells), cells.clamp(0, early - 1)]
    else:
        in_slots = cells
    moved = torch.where(cells >= early, cells - early + num_slots, in_slots)
    return torch.cat((slots, region_kv[cut:])), torch.where(cells >= 0, moved, -1)
