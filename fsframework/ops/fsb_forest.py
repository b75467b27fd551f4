"""FS-B forests (docs/freesolo.md §1.8): binary chunks of admitted cells, chunk trees, the join chain.

One `Forest` indexes the admitted cells of one batch row and one head. Cells arrive
in cell order, a query block's worth at a time (`admit`). With `M` admitted cells
written `M = 2^k1 + ... + 2^kr` (k1 > ... > kr), the chunks are the consecutive runs
of those sizes, oldest first (13 = 8 + 4 + 1). A chunk of `n = 2^k` cells has a
perfect binary chunk tree: a node over `m > 1` cells centers their mean keys on
their mean, starts from the farthest cell, does two power iterations, and sends the
`m/2` cells of smallest projection (ties: earlier cell) to the left child. Every node
stores `mu` (mean of the cells' mean keys), the exact radius `rho`, `A = max a_c`
and `pmin = min p_c`. The join chain links the chunk roots, newest deepest, with
the triangle-bound radius; the forest's height is `ceil(log2 M)`.

Storage is one node buffer per forest (a row of a `NodeStore`, which holds the forests of
every batch row and head side by side so one search reads them all), grown
geometrically. Chunk trees sit in it
as a stack in chunk order (a tree of n cells takes `2n - 1` slots), so admitting
cells only rewrites the tail: the chunks shared with the previous decomposition
keep their trees untouched, the merged chunks get trees built over their cells,
and the `r - 1` join nodes follow the last tree. A tree of n cells costs
`O(n log n)` (linear-time median splits per level), so the whole build is
`O(M log^2 M)`, never an `N x M` tensor.
"""

from __future__ import annotations

import torch


def chunk_sizes(num: int) -> list[int]:
    """Sizes of the chunks of `num` admitted cells, oldest first: the binary expansion (13 -> [8, 4, 1])."""
    return [1 << bit for bit in range(num.bit_length() - 1, -1, -1) if num >> bit & 1]


def power_iteration(x: torch.Tensor, u: torch.Tensor, steps: int = 2) -> torch.Tensor:
    """`u <- X^T X u / ||X^T X u||`, `steps` times, batched: x `[..., m, d]` centered rows, u `[..., d]`.

    Where `||X^T X u|| = 0` the previous `u` is kept (docs/freesolo.md §1.8), so identical
    cells give a zero direction and a split in arrival order, never a NaN.
    """
    for _ in range(steps):
        w = torch.einsum("...md,...m->...d", x, torch.einsum("...md,...d->...m", x, u))
        norm = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
        u = torch.where(norm > 0, w / torch.where(norm > 0, norm, 1.0), u)
    return u


def build_chunk_trees(kbar: torch.Tensor, a: torch.Tensor, p: torch.Tensor,
                      cells: torch.Tensor) -> dict[str, torch.Tensor]:
    """Perfect chunk trees over G chunks of `n = 2^k` cells each, in heap order.

    kbar `[G, n, d]` mean keys, a `[G, n]` priorities, p `[G, n]` centers, cells `[G, n]` cell
    ids, all in arrival order. Returns `mu [G, 2n-1, d]`, `rho`, `amax`, `pmin [G, 2n-1]`
    and `cell [G, 2n-1]` (the leaf's cell id, -1 at internal nodes); node `g` has
    children `2g + 1`, `2g + 2`. Level by level, every segment kept in arrival order.
    """
    groups, num, dim = kbar.shape
    if num & (num - 1):
        raise ValueError(f"a chunk holds a power of two cells, got {num}")
    nodes = 2 * num - 1
    out = {"mu": kbar.new_zeros(groups, nodes, dim), "rho": kbar.new_zeros(groups, nodes),
           "amax": kbar.new_zeros(groups, nodes), "pmin": kbar.new_zeros(groups, nodes),
           "cell": torch.full((groups, nodes), -1, dtype=torch.long, device=kbar.device)}
    x, a, p, ids = kbar[:, None], a[:, None], p[:, None], cells[:, None]  # [G, S segments, m, ...]
    level = 0
    while True:
        segs, width = x.shape[1], x.shape[2]
        first = (1 << level) - 1
        mu = x.mean(dim=2)
        centered = x - mu[:, :, None]
        dist = torch.linalg.vector_norm(centered, dim=-1)  # G S m
        out["mu"][:, first:first + segs] = mu
        out["rho"][:, first:first + segs] = dist.amax(dim=-1)
        out["amax"][:, first:first + segs] = a.amax(dim=-1)
        out["pmin"][:, first:first + segs] = p.amin(dim=-1)
        if width == 1:
            out["cell"][:, first:first + segs] = ids[..., 0]
            return out
        # the farthest cell starts the power iteration (argmax: the earliest among equals)
        far = dist.argmax(dim=-1)
        u0 = centered.gather(2, far[:, :, None, None].expand(-1, -1, 1, dim))[:, :, 0]
        proj = torch.einsum("gsmd,gsd->gsm", centered, power_iteration(centered, u0))
        half = width // 2  # ceil(m/2) = m/2 for a power of two
        kth = proj.kthvalue(half, dim=-1, keepdim=True).values
        below, tied = proj < kth, proj == kth
        need = half - below.sum(dim=-1, keepdim=True)
        left = below | (tied & (tied.cumsum(dim=-1) <= need))  # ties on the median: earlier cells go left
        # stable partition: left cells first, each side in arrival order
        dest = torch.where(left, left.cumsum(dim=-1) - 1, half + (~left).cumsum(dim=-1) - 1)
        x = torch.empty_like(x).scatter_(2, dest[..., None].expand(-1, -1, -1, dim), x)
        a, p, ids = (torch.empty_like(t).scatter_(2, dest, t) for t in (a, p, ids))
        x = x.reshape(groups, 2 * segs, half, dim)
        a, p, ids = (t.reshape(groups, 2 * segs, half) for t in (a, p, ids))
        level += 1


NODE_FIELDS = ("mu", "rho", "amax", "pmin", "left", "right", "cell")


class NodeStore:
    """Node buffers of G forests side by side, `[G, capacity, ...]`, so one beam search can
    gather from all of them at once. Capacity doubles when a forest needs more (amortized
    O(1) copies per node); only the forest being extended writes its row."""

    def __init__(self, rows: int, dim: int, *, dtype: torch.dtype, device: torch.device, capacity: int = 16):
        self.rows, self.dim, self.dtype, self.device = rows, dim, dtype, device
        self.tensors: dict[str, torch.Tensor] = {}
        self._alloc(max(1, capacity), used=0)

    def _alloc(self, capacity: int, used: int) -> None:
        rows, kw = self.rows, dict(dtype=self.dtype, device=self.device)
        new = {"mu": torch.zeros(rows, capacity, self.dim, **kw), "rho": torch.zeros(rows, capacity, **kw),
               "amax": torch.zeros(rows, capacity, **kw), "pmin": torch.zeros(rows, capacity, **kw)}
        for name in ("left", "right", "cell"):
            new[name] = torch.full((rows, capacity), -1, dtype=torch.long, device=self.device)
        for name, old in self.tensors.items():
            new[name][:, :used] = old[:, :used]
        self.tensors = new

    @property
    def capacity(self) -> int:
        return self.tensors["rho"].shape[1]

    def reserve(self, nodes: int) -> None:
        """Room for `nodes` nodes in every row."""
        capacity = self.capacity
        if nodes > capacity:
            while capacity < nodes:
                capacity *= 2
            self._alloc(capacity, used=self.capacity)


class Forest:
    """The forest of one batch row and head over the cells admitted so far (module docstring).

    kbar `[C, d]`, a `[C]`, p `[C]`: summaries of every complete cell (only admitted ones
    are read). Node arrays (first `size` rows valid), views of row `row` of `store` (a
    `NodeStore`; by default one of its own): `mu [., d]`, `rho`, `amax`, `pmin`, `left`,
    `right` (child node, -1 at leaves), `cell` (leaf cell, -1 inside); `root` (-1 while empty).
    """

    def __init__(self, kbar: torch.Tensor, a: torch.Tensor, p: torch.Tensor, capacity: int = 16,
                 store: NodeStore | None = None, row: int = 0):
        self.kbar, self.a, self.p = kbar, a, p
        self.store = store or NodeStore(1, kbar.shape[-1], dtype=kbar.dtype, device=kbar.device, capacity=capacity)
        self.row = row
        self.cells = torch.empty(0, dtype=torch.long, device=kbar.device)  # admitted, arrival order
        self.chunks: list[tuple[int, int, int]] = []  # (first admitted position, size, node offset)
        self.size = 0  # nodes in use: the chunk trees, then the join chain
        self.root = -1

    def __getattr__(self, name: str) -> torch.Tensor:
        if name in NODE_FIELDS:  # always the store's current buffer (it may have grown)
            return self.__dict__["store"].tensors[name][self.__dict__["row"]]
        raise AttributeError(name)

    @property
    def num_cells(self) -> int:
        return self.cells.numel()

    def admit(self, new_cells: torch.Tensor) -> None:
        """Append newly eligible admitted cells (ascending ids, after every admitted one)."""
        if new_cells.numel() == 0:
            return
        self.cells = torch.cat((self.cells, new_cells))
        wanted, first = [], 0
        for size in chunk_sizes(self.num_cells):
            wanted.append((first, size))
            first += size
        keep = 0  # chunks shared with the previous decomposition keep their trees
        while keep < min(len(wanted), len(self.chunks)) and self.chunks[keep][:2] == wanted[keep]:
            keep += 1
        self.chunks = self.chunks[:keep]
        self.size = self.chunks[-1][2] + 2 * self.chunks[-1][1] - 1 if self.chunks else 0
        self.store.reserve(2 * self.num_cells - 1)
        for first, size in wanted[keep:]:
            self._write_chunk_tree(first, size)
        self._write_join_chain()

    def _write_chunk_tree(self, first: int, size: int) -> None:
        ids = self.cells[first:first + size]
        tree = build_chunk_trees(self.kbar[ids][None], self.a[ids][None], self.p[ids][None], ids[None])
        offset, nodes = self.size, 2 * size - 1
        for name in ("mu", "rho", "amax", "pmin", "cell"):
            getattr(self, name)[offset:offset + nodes] = tree[name][0]
        heap = torch.arange(nodes, device=ids.device)
        internal = heap < size - 1
        self.left[offset:offset + nodes] = torch.where(internal, offset + 2 * heap + 1, -1)
        self.right[offset:offset + nodes] = torch.where(internal, offset + 2 * heap + 2, -1)
        self.chunks.append((first, size, offset))
        self.size += nodes

    def _write_join_chain(self) -> None:
        """J_r = root(G_r); J_t joins root(G_t) and J_{t+1}; J_1 is the root (triangle-bound radius)."""
        below, below_count = self.chunks[-1][2], self.chunks[-1][1]
        for _, size, offset in reversed(self.chunks[:-1]):
            node = self.size
            na, nb = float(size), float(below_count)
            mu = (na * self.mu[offset] + nb * self.mu[below]) / (na + nb)
            self.mu[node] = mu
            self.rho[node] = torch.maximum(torch.linalg.vector_norm(self.mu[offset] - mu) + self.rho[offset],
                                           torch.linalg.vector_norm(self.mu[below] - mu) + self.rho[below])
            self.amax[node] = torch.maximum(self.amax[offset], self.amax[below])
            self.pmin[node] = torch.minimum(self.pmin[offset], self.pmin[below])
            self.left[node], self.right[node], self.cell[node] = offset, below, -1
            below, below_count = node, below_count + size
            self.size += 1
        self.root = below

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
