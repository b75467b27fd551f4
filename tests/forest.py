"""One FS-B forest read node by node (tests/ops/test_fsb.py; docs/freesolo.md §1.8).

`Forest` wraps a `fsframework.ops.fsb_forest.Forests` of one row: the library grows and searches
the forests of every batch row, head and forest kind together and never needs one alone, so
this view, which the forest tests compare and walk, lives with them.
"""

from __future__ import annotations

import torch

from fsframework.ops.fsb_forest import NODE_FIELDS, Forests, NodeStore, chunk_sizes


class Forest:
    """One forest (one batch row and head) over the cells admitted so far: a `Forests` of one row,
    read node by node.

    kbar `[C, d]`, a `[C]`, p `[C]`: summaries of every complete cell (only admitted ones
    are read). Node arrays (first `size` rows valid), views of the store's row: `mu [., d]`,
    `rho`, `amax`, `pmin`, `left`, `right` (child node, -1 at leaves), `cell` (leaf cell, -1
    inside); `root` (-1 while empty).
    """

    def __init__(self, kbar: torch.Tensor, a: torch.Tensor, p: torch.Tensor, capacity: int = 16):
        self.kbar, self.a, self.p = kbar, a, p
        self.batch = Forests(1, kbar.shape[-1], dtype=kbar.dtype, device=kbar.device, capacity=capacity)

    @property
    def store(self) -> NodeStore:
        return self.batch.store

    def __getattr__(self, name: str) -> torch.Tensor:
        if name in NODE_FIELDS:  # always the store's current buffer (it may have grown)
            return self.__dict__["batch"].store.tensors[name][0]
        raise AttributeError(name)

    @property
    def num_cells(self) -> int:
        return int(self.batch.count[0])

    @property
    def cells(self) -> torch.Tensor:
        return self.batch.ids[0, : self.num_cells]

    @property
    def root(self) -> int:
        return int(self.batch.root[0])

    @property
    def size(self) -> int:
        return max(0, 2 * self.num_cells - 1)

    @property
    def chunks(self) -> list[tuple[int, int, int]]:
        """(first admitted position, size, node offset) of each chunk, oldest first."""
        out, first, offset = [], 0, 0
        for size in chunk_sizes(self.num_cells):
            out.append((first, size, offset))
            first, offset = first + size, offset + 2 * size - 1
        return out

    def admit(self, new_cells: torch.Tensor) -> None:
        """Append newly eligible admitted cells (ascending ids, after every admitted one)."""
        keep = torch.ones(1, new_cells.numel(), dtype=torch.bool, device=new_cells.device)
        self.batch.admit(self.kbar[new_cells][None], self.a[new_cells][None], self.p[new_cells], new_cells, keep)

    def height(self) -> int:
        """Edges on the longest root-to-leaf path (0 for one cell, -1 when empty)."""
        if self.root < 0:
            return -1
        depth, frontier = 0, [self.root]
        while True:
            children = [c for v in frontier for c in (int(self.left[v]), int(self.right[v])) if c >= 0]
            if not children:
                return depth
            frontier, depth = children, depth + 1

    def leaves_below(self, node: int) -> list[int]:
        """Cells under `node` (for tests and diagnostics)."""
        if int(self.cell[node]) >= 0:
            return [int(self.cell[node])]
        return self.leaves_below(int(self.left[node])) + self.leaves_below(int(self.right[node]))

    def state(self) -> dict[str, torch.Tensor]:
        """The used node arrays (a copy-free view), for comparison and search."""
        return {name: getattr(self, name)[: self.size] for name in NODE_FIELDS}
