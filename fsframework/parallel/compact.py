"""The keys a FreeSolo layer reads under sequence parallelism, compact: what its queries read, not the prefix.

Legend: B batch, n own queries at `[start, end)`, H heads, 2d keys and values side by side,
s cell size, K cells per query.

A rank that routed its queries itself (FS: `fsframework.parallel.selected`; FS-L:
`fsframework.parallel.retained.retained_routed_kv`) knows which earlier cells they read, so it
hands the layer only those, per (batch row, head), then the window's halo and its own keys,
and re-indexes the cells into that tensor (a `PrefixKeys` state, `fsframework.ops.freesolo_driver`):
the readout is NoPE, so position-free, and the window reads the contiguous positions before the own
keys. A rank then holds the cells its queries read instead of a prefix-long tensor.
"""

from __future__ import annotations

import torch


Held = list[tuple[int, int]]  # the position ranges a rank's key tensor holds, concatenated in order


def local_positions(rows: torch.Tensor, s: int, held: Held) -> torch.Tensor:
    """rows (b, h, cell) `[m, 3]` of cells inside `held` -> their positions `[m, s]` in the
    concatenation of the held ranges."""
    lows = torch.tensor([lo for lo, _ in held], device=rows.device)
    offsets = torch.tensor([0] + [hi - lo for lo, hi in held[:-1]], device=rows.device).cumsum(0)
    first = rows[:, 2:] * s  # m 1
    piece = torch.bucketize(first, lows, right=True) - 1
    return first - lows[piece] + offsets[piece] + torch.arange(s, device=rows.device)


def cells_of(x: torch.Tensor, rows: torch.Tensor, first_pos: int | Held, s: int) -> torch.Tensor:
    """x `[B, T, H, f]` holding positions `[first_pos, first_pos + T)` (or the ranges `held`,
    concatenated); rows (b, h, cell) `[m, 3]` -> `[m, s, f]`."""
    held = [(first_pos, first_pos + x.shape[1])] if isinstance(first_pos, int) else first_pos
    return x[rows[:, :1], local_positions(rows, s, held), rows[:, 1:2]]


def cells_read(cells: torch.Tensor, upto: int) -> torch.Tensor:
    """Which of the cells `[0, upto)` some query reads, per (row, head): bool `[B, H, upto]` from the
    queries' cells `[B, n, H, K]` (-1 none)."""
    read = torch.zeros((cells.shape[0], cells.shape[2], upto), dtype=torch.bool, device=cells.device)
    picked = (cells >= 0) & (cells < upto)
    row, _, head, _ = picked.nonzero(as_tuple=True)
    read[row, head, cells[picked]] = True
    return read


def compact_keys(kv: torch.Tensor, fetched: torch.Tensor, rows: torch.Tensor, cells: torch.Tensor,
                 own_before: list[tuple[tuple[int, int], torch.Tensor]], start: int, tail: int,
                 s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values a call reads, compact, and its queries' cells as indices into them.

    kv `[B, n, H, 2d]` own (positions `[start, end)`); fetched `[m, s, 2d]` the cells `rows`
    (row, head, cell) `[m, 3]`, every cell of `[tail, start)` the rank does not hold among them
    (cells no query reads are left out); cells `[B, n, H, K]` (sequence cell indices, -1 none);
    own_before: this rank's earlier runs `((lo, hi), kv)` (zigzag). Returns `[B, c s + start - tail + n,
    H, 2d]`: per (row, head) the cells before `tail` its queries selected, in cell order, padded to
    the most any (row, head) reads (`c` cells), then the positions `[tail, end)` whole (the
    window's halo and the own keys); and the cells, re-indexed into that tensor. The readout is
    position-free (NoPE) and the window reads the contiguous positions before the own keys, so
    both read exactly what they read in the whole prefix.
    """
    bsz, _, heads, width = kv.shape
    early = tail // s
    in_halo = rows[:, 2] >= early
    halo_rows = rows[in_halo]
    halo = kv.new_zeros((bsz, start - tail, heads, width)).index_put(
        (halo_rows[:, :1], local_positions(halo_rows, s, [(tail, start)]), halo_rows[:, 1:2]), fetched[in_halo])
    for (lo, hi), own in own_before:  # an own earlier run may reach into the halo
        if hi > tail:
            cut = max(lo, tail)
            halo = torch.cat((halo[:, : cut - tail], own[:, cut - lo:], halo[:, hi - tail:]), dim=1)
    read = cells_read(cells, early)
    slot_of = read.long().cumsum(-1) - 1  # B H early: a read cell's slot in its (row, head)
    num_slots = int(read.sum(-1).max()) if early else 0
    slots = kv.new_zeros((bsz, num_slots * s, heads, width))

    def place(slots: torch.Tensor, where: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        pos = slot_of[where[:, 0], where[:, 1], where[:, 2]][:, None] * s + torch.arange(s, device=kv.device)
        return slots.index_put((where[:, :1], pos, where[:, 1:2]), values)

    far = rows[~in_halo]
    used = read[far[:, 0], far[:, 1], far[:, 2]]  # FS-L fetches every retained cell; its queries read some
    slots = place(slots, far[used], fetched[~in_halo][used])
    if own_before:  # own earlier cells the queries read, from the kept keys
        mine = torch.zeros(early, dtype=torch.bool, device=kv.device)
        for (lo, hi), _ in own_before:
            mine[lo // s: min(hi, tail) // s] = True
        own_rows = (read & mine).nonzero()
        ranges = [span for span, _ in own_before]
        slots = place(slots, own_rows, cells_of(torch.cat([x for _, x in own_before], dim=1), own_rows, ranges, s))
    if early:
        batch = torch.arange(bsz, device=cells.device).view(-1, 1, 1, 1)
        head = torch.arange(heads, device=cells.device).view(1, 1, -1, 1)
        in_slots = slot_of[batch, head, cells.clamp(0, early - 1)]
    else:
        in_slots = cells
    moved = torch.where(cells >= early, cells - early + num_slots, in_slots)
    return torch.cat((slots, halo, kv), dim=1), torch.where(cells >= 0, moved, -1)
