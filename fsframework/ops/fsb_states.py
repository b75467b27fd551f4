"""Every state of FS-B's forests over a whole sequence, built at once (docs/freesolo.md §1.8).

Legend: R forest rows (batch row x head x forest kind), C cells in arrival order, M the most
cells a row admits, J states (one per query block), d head width.

Whole-sequence routing searches the block at position `b` in the forests of the cells that
are eligible before `b`. Growing them block by block (`Forests.admit`, as a decode cache does)
costs about a thousand small ops per block. But a forest's chunk trees depend only on their
cells: with `c` cells admitted, the chunk of `2^b` cells, when bit `b` of `c` is set, is cells
`[i 2^(b+1), i 2^(b+1) + 2^b)` of the row's admitted cells, `i = c >> (b + 1)`. So every tree
a set of states uses is one of the aligned chunks `i 2^(b+1)` of each size, and those are built
in one batched call for every size (`build_trees`); what differs from state to state is only its
join chain (`popcount(c) - 1` nodes), built for every state at once.
States of consecutive blocks share their large chunks: for a window of blocks the store holds
about `2 M + (the window's cells) log2 M` slots per row (`select_cells_fsb` sizes its windows by
a memory budget), all blocks at once `M log2 M`, the incremental forests `2 M`. The nodes hold the same
numbers as `Forests.admit` writes (the same `build_trees` over the same cells, the same
`write_join_chains`), so a search returns the same cells; only the slots differ.
"""

from __future__ import annotations

import torch

from fsframework.ops.fsb_forest import NodeStore, build_trees, chunk_inputs, write_join_chains, write_trees


class _Chunks:
    """The chunk trees of size `2^bit` that some state uses. A state of `c` cells counted from admitted
    cell `begin` (0, or its document's first) holds, where bit `bit` of `c` is set, the chunk of cells
    `[f, f + 2^bit)`, `f = begin + (c >> (bit + 1)) 2^(bit + 1)`; a chunk is known by its row and `f`
    (the chunks of two documents are disjoint), and the `k`-th of its row's sits at slot
    `base + k (2^(bit+1) - 1)`."""

    def __init__(self, bit: int, counts: torch.Tensor, begins: torch.Tensor, base: int, span: int):
        rows = counts.shape[0]
        self.bit, self.base, self.nodes = bit, base, (2 << bit) - 1
        self.span = span  # above every first cell: the most cells a row admits, plus one
        used = ((counts >> bit) & 1) == 1
        row = torch.arange(rows, device=counts.device)[:, None].expand_as(counts)
        self.keys = torch.unique(row[used] * self.span + self.first(begins[used], counts[used]))  # sorted
        self.row, self.start = self.keys // self.span, self.keys % self.span
        first = torch.searchsorted(self.keys, torch.arange(rows + 1, device=counts.device) * self.span)
        self.rank = torch.arange(self.keys.numel(), device=counts.device) - first[self.row]  # k
        self.width = int(self.rank.max()) + 1 if self.keys.numel() else 0  # the most chunks a row uses

    def first(self, begin: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """The first admitted cell of the chunk of `2^bit` cells of states of `count` cells from `begin`."""
        return begin + (count >> (self.bit + 1) << (self.bit + 1))

    def slots(self) -> torch.Tensor:
        return self.base + self.rank * self.nodes

    def root(self, row: torch.Tensor, begin: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """The root slot of the chunk of `2^bit` cells of states `count` from `begin` (whose bit is set) in `row`."""
        at = torch.searchsorted(self.keys, row * self.span + self.first(begin, count))
        return self.base + self.rank[at.clamp_max(max(self.keys.numel() - 1, 0))] * self.nodes


def forest_states(kbar: torch.Tensor, a: torch.Tensor, p: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor,
                  arrived: torch.Tensor, firsts: torch.Tensor | None = None) -> tuple[NodeStore, torch.Tensor]:
    """The forests of the given states at once -> (node store, roots `[R, J]`, -1 where a state is empty).

    kbar `[R, C, d]`, a `[R, C]` per row; p `[C]`, ids `[C]` of the cells in arrival order; keep
    `[R, C]` bool: the cells each row admits (`F0` all, `Ftau` those with `a_c >= tau_h`); arrived
    `[J]` non-decreasing: state j holds the admitted ones of the first `arrived[j]` cells, or, with
    `firsts [J]` (packed documents, each state's document's first cell, `firsts[j] <= arrived[j]`),
    of cells `[firsts[j], arrived[j])`: a document's forest restarts at its first cell, as if it were
    a row of its own. Only the chunk trees these states use are built: states of a window of blocks
    share their large chunks, so the store holds about `2 M + (cells in the window) log2 M` slots per
    row, not `M log2 M`.
    """
    rows, num, dim = kbar.shape
    device = kbar.device
    # each row's admitted cells first, in arrival order
    order = (~keep).to(torch.uint8).argsort(dim=1, stable=True)
    admitted = keep.long().cumsum(dim=1)
    before = torch.cat((admitted.new_zeros(rows, 1), admitted), dim=1)  # R C+1: cells admitted before each
    ends = before[:, arrived]  # R J: cells admitted by then
    begins = torch.zeros_like(ends) if firsts is None else before[:, firsts]
    counts = ends - begins
    most = int(ends.max()) if ends.numel() else 0
    order = order[:, :most]
    kbar = kbar.gather(1, order[..., None].expand(-1, -1, dim))
    a, p, ids = a.gather(1, order), p.expand(rows, -1).gather(1, order), ids.expand(rows, -1).gather(1, order)
    chunks, base = [], 0
    for bit in range(max(int(counts.max()).bit_length() if counts.numel() else 0, 1)):
        chunks.append(_Chunks(bit, counts, begins, base, most + 1))
        base += chunks[-1].width * chunks[-1].nodes
    states = arrived.numel()
    store = NodeStore(rows, dim, dtype=kbar.dtype, device=device, capacity=max(1, base + states * len(chunks)))
    t = store.tensors
    used = [chunk for chunk in chunks if chunk.keys.numel()]
    inputs = [chunk_inputs(kbar, a, p, ids, chunk.row, chunk.start, chunk.bit) for chunk in used]
    for chunk, built in zip(used, build_trees(inputs)):  # every size at once
        write_trees(t, chunk.row, chunk.slots(), built)
    return store, _join_chains(t, counts, begins, chunks, base)


def _join_chains(t: dict[str, torch.Tensor], counts: torch.Tensor, begins: torch.Tensor, chunks: list[_Chunks],
                 joins_at: int) -> torch.Tensor:
    """Each state's join chain (`write_join_chains`) in its own slots from `joins_at`; -> roots `[R, J]`."""
    rows, states = counts.shape
    bits = len(chunks)
    count, begin = counts.flatten(), begins.flatten()  # pairs (row, state)
    row = torch.arange(rows, device=count.device).repeat_interleave(states)
    slot = joins_at + torch.arange(states, device=count.device).repeat(rows) * bits
    roots = torch.full((count.numel(), bits), -1, dtype=torch.long, device=count.device)
    for chunk in chunks:  # where a state holds the chunk of 2^bit cells, its root
        at = (((count >> chunk.bit) & 1) == 1).nonzero().squeeze(1)
        if at.numel():
            roots[at, chunk.bit] = chunk.root(row[at], begin[at], count[at])
    top = write_join_chains(t, row, count, slot, roots)
    return top.view(rows, states)
