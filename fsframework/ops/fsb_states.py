"""Every state of FS-B's forests over a whole sequence, built at once (docs/freesolo.md §1.8).

Legend: R forest rows (batch row x head x forest kind), C cells in arrival order, M the most
cells a row admits, J states (one per query block), d head width.

Whole-sequence routing searches the block at position `b` in the forests of the cells that
are eligible before `b`. Growing them block by block (`Forests.admit`, as a decode cache does)
costs about a thousand small ops per block. But a forest's chunk trees depend only on their
cells: with `c` cells admitted, the chunk of `2^b` cells, when bit `b` of `c` is set, is cells
`[i 2^(b+1), i 2^(b+1) + 2^b)` of the row's admitted cells, `i = c >> (b + 1)`. So every tree
any state uses is one of the aligned chunks `i 2^(b+1)` of each size, and all of them are built
in one batched call per size (`log2 M + 1` calls, `O(M log M)` nodes per row instead of the
incremental `2 M`); what differs from state to state is only its join chain (`popcount(c) - 1`
nodes), built for every state at once, one chunk size at a time. The nodes hold the same
numbers as `Forests.admit` writes (the same `build_chunk_trees` over the same cells, the same
`write_joins`), so a search returns the same cells; only the slots differ.
"""

from __future__ import annotations

import torch

from fsframework.ops.fsb_forest import NodeStore, build_chunk_trees, lowest_bit, write_joins, write_trees


def _tree_layout(most: int) -> tuple[list[int], list[int], int]:
    """Per chunk size `2^b`: the first slot of its trees and how many there are (aligned chunks
    `i 2^(b+1)` with `2^b` cells within `most`); and the first slot after every tree."""
    bases, counts, base = [], [], 0
    for bit in range(max(most.bit_length(), 1)):
        size = 1 << bit
        trees = (most - size) // (2 * size) + 1 if most >= size else 0
        bases.append(base)
        counts.append(trees)
        base += trees * (2 * size - 1)
    return bases, counts, base


def forest_states(kbar: torch.Tensor, a: torch.Tensor, p: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor,
                  arrived: torch.Tensor) -> tuple[NodeStore, torch.Tensor]:
    """The forests of every state at once -> (node store, roots `[R, J]`, -1 where a state is empty).

    kbar `[R, C, d]`, a `[R, C]` per row; p `[C]`, ids `[C]` of the cells in arrival order; keep
    `[R, C]` bool: the cells each row admits (`F0` all, `Ftau` those with `a_c >= tau_h`); arrived
    `[J]` non-decreasing: state j holds the first `arrived[j]` cells' admitted ones.
    """
    rows, num, dim = kbar.shape
    device = kbar.device
    # each row's admitted cells first, in arrival order
    order = (~keep).to(torch.uint8).argsort(dim=1, stable=True)
    total = keep.sum(dim=1)
    most = int(total.max()) if rows else 0
    order = order[:, :most]
    kbar = kbar.gather(1, order[..., None].expand(-1, -1, dim))
    a, p, ids = a.gather(1, order), p.expand(rows, -1).gather(1, order), ids.expand(rows, -1).gather(1, order)
    admitted = torch.cat((total.new_zeros(rows, 1), keep.long().cumsum(dim=1)), dim=1)[:, arrived]  # R J
    bases, counts, joins_at = _tree_layout(most)
    bits, states = len(bases), arrived.numel()
    store = NodeStore(rows, dim, dtype=kbar.dtype, device=device, capacity=max(1, joins_at + states * bits))
    t = store.tensors
    for bit, (base, trees) in enumerate(zip(bases, counts)):
        size = 1 << bit
        starts = torch.arange(trees, device=device) * (2 * size)
        row, tree = (starts[None, :] + size <= total[:, None]).nonzero(as_tuple=True)  # the chunks that exist
        if row.numel() == 0:
            continue
        cells, r = starts[tree][:, None] + torch.arange(size, device=device), row[:, None]
        built = build_chunk_trees(kbar[r, cells], a[r, cells], p[r, cells], ids[r, cells])
        write_trees(t, row, base + tree * (2 * size - 1), built)
    return store, _join_chains(t, admitted, bases, joins_at, bits)


def _join_chains(t: dict[str, torch.Tensor], admitted: torch.Tensor, bases: list[int], joins_at: int,
                 bits: int) -> torch.Tensor:
    """Each state's join chain (`Forests._write_join_chains`: the smallest chunk's root first, each
    larger chunk joined above it) in its own `bits` slots from `joins_at`; -> roots `[R, J]`."""
    rows, states = admitted.shape
    count = admitted.flatten()  # pairs (row, state)
    row = torch.arange(rows, device=count.device).repeat_interleave(states)
    slot = joins_at + torch.arange(states, device=count.device).repeat(rows) * bits
    base = torch.tensor(bases, device=count.device)

    def root(bit: torch.Tensor | int, c: torch.Tensor) -> torch.Tensor:  # the root of c's chunk of 2^bit cells
        return base[bit] + (c >> (bit + 1)) * ((2 << bit) - 1)

    low = lowest_bit(count).clamp_min(0)
    below = torch.where(count > 0, root(low, count), -1)
    below_cells = torch.where(count > 0, 1 << low, 0)
    for bit in range(bits):
        pairs = (((count >> bit) & 1 == 1) & (low < bit)).nonzero().squeeze(1)
        if pairs.numel() == 0:
            continue
        node = slot[pairs]
        write_joins(t, row[pairs], root(bit, count[pairs]), below[pairs], node, 1 << bit, below_cells[pairs])
        below[pairs], below_cells[pairs], slot[pairs] = node, below_cells[pairs] + (1 << bit), node + 1
    return below.view(rows, states)
