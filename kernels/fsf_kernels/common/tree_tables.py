"""Index tables that run the tree scan of many sequences of different lengths in one tree
(docs/argrc.md §2, "Packed documents").

Each sequence keeps its own tree, aligned at its own position 0 (`fsframework.ops.scan`): its
level `l` holds the roots of its complete aligned blocks of `2**l` leaves. Laid end to end, the
nodes of one level of all the sequences form one flat array, and every step of the scan (a
level of the up-sweep, a level of the down-sweep) becomes one gather of operands from the level
below, one combine call on all of them and, going down, one gather that interleaves the results:
`2 * ceil(log2 max_n)` combine calls however many sequences there are, each combining exactly
the rows the sequences scanned one by one would combine. The tables are the gathers' indices,
built on the host from the lengths alone (`tree_tables`), once per batch.

Legend: S sequences, n_s the leaves of sequence s (in order), R0 = sum n_s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TreeTables:
    """The gathers of a packed tree scan (module docstring), every index a LongTensor.

    up_left[l - 1] `[M_l]`: for level `l >= 1`, the left child of each node in level `l - 1`'s array
    (its right child is the next row). Level 0 is the leaves, `R0` rows in sequence order.
    roots: how many sequences have a root value at the top level `len(down_parent)`; the down-sweep
    starts from that many copies of the identity.
    For each down-sweep step, top to bottom (`down_*[i]` is level `top - 1 - i`):
    down_parent `[R_i]`: each right child's parent in the values above (its down-sweep value);
    down_sibling `[R_i]`: the right child's left sibling in the up-sweep level (`up` array of that level);
    down_gather `[C_i]`: the level's values from `cat(values above, right children's values, identity)`:
    a left child takes its parent's value, a right child its combine, a sequence whose tree starts at
    this level the identity (the last row).
    """

    leaves: int
    up_left: list[torch.Tensor]
    roots: int
    down_parent: list[torch.Tensor]
    down_sibling: list[torch.Tensor]
    down_gather: list[torch.Tensor]

    def to(self, device) -> "TreeTables":
        move = lambda ts: [t.to(device, non_blocking=True) for t in ts]  # noqa: E731
        return TreeTables(self.leaves, move(self.up_left), self.roots, move(self.down_parent),
                          move(self.down_sibling), move(self.down_gather))


def _segments(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For segments of `counts` `[S]` rows laid end to end: each segment's offset `[S]`, and for each
    row its segment `[sum]` and its index inside the segment `[sum]`."""
    offsets = torch.cumsum(counts, 0) - counts
    segment = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    return offsets, segment, torch.arange(int(counts.sum())) - offsets[segment]


def _ceil_div(n: torch.Tensor, size: int) -> torch.Tensor:
    return -torch.div(-n, size, rounding_mode="floor")


def tree_tables(leaves: list[int] | torch.Tensor) -> TreeTables:
    """The tables of the packed tree scan of sequences of `leaves` leaves each (all >= 1), on the CPU."""
    n = torch.as_tensor(leaves, dtype=torch.long).cpu()
    if n.dim() != 1 or n.numel() == 0 or int(n.min()) < 1:
        raise ValueError(f"tree_tables needs one or more sequences of at least one leaf, got {n.tolist()}")
    up_left, counts = [], n
    while int(counts.max()) >= 2:  # level l from level l - 1: pairs of complete blocks
        pairs = counts // 2
        _, segment, j = _segments(pairs)
        up_left.append((torch.cumsum(counts, 0) - counts)[segment] + 2 * j)
        counts = pairs
    heights = torch.tensor([max(int(s) - 1, 0).bit_length() for s in n])  # each root block covers [0, n_s)
    top = int(heights.max())
    above = (heights == top).long()  # the values of level `top`: one per sequence that starts there
    down_parent, down_sibling, down_gather = [], [], []
    for level in range(top - 1, -1, -1):
        active = heights > level  # sequences with values above this level
        count = torch.where(active, _ceil_div(n, 2**level), torch.zeros_like(n))  # nodes starting before n_s
        rights = count // 2
        above_offsets = torch.cumsum(above, 0) - above
        up_offsets = torch.cumsum(n // 2**level, 0) - n // 2**level
        right_offsets, segment, j = _segments(rights)
        down_parent.append(above_offsets[segment] + j)
        down_sibling.append(up_offsets[segment] + 2 * j)
        starts = heights == level  # sequences whose tree starts at this level: the identity
        here = torch.where(starts, torch.ones_like(n), count)
        _, segment, p = _segments(here)
        n_above, n_right = int(above.sum()), int(rights.sum())
        gather = torch.where(p % 2 == 0, above_offsets[segment] + p // 2, n_above + right_offsets[segment] + p // 2)
        down_gather.append(torch.where(starts[segment], torch.full_like(gather, n_above + n_right), gather))
        above = here
    return TreeTables(int(n.sum()), up_left, int((heights == top).sum()), down_parent, down_sibling, down_gather)
