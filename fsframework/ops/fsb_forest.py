"""FS-B forests (docs/freesolo.md §1.8): binary chunks of admitted cells, chunk trees, the join chain.

One forest indexes the admitted cells of one batch row and one head. Cells arrive
in cell order, a query block's worth at a time (`admit`). With `M` admitted cells
written `M = 2^k1 + ... + 2^kr` (k1 > ... > kr), the chunks are the consecutive runs
of those sizes, oldest first (13 = 8 + 4 + 1). A chunk of `n = 2^k` cells has a
perfect binary chunk tree: a node over `m > 1` cells centers their mean keys on
their mean, starts from the farthest cell, does two power iterations, and sends the
`m/2` cells of smallest projection (ties: earlier cell) to the left child. Every node
stores `mu` (mean of the cells' mean keys), the exact radius `rho`, `A = max a_c`
and `pmin = min p_c`. The join chain links the chunk roots, newest deepest, with
the triangle-bound radius; the forest's height is `ceil(log2 M)`.

Storage is one node buffer per forest, a row of a `NodeStore`: `Forests` keeps the
forests of every batch row, head and forest kind side by side, so one search reads them
all and one admission grows them all. Chunk trees sit in a row as a stack in chunk order
(a tree of n cells takes `2n - 1` slots), so admitting cells only rewrites the tail: the
chunks shared with the previous decomposition keep their trees untouched, the merged
chunks get trees built over their cells, and the `r - 1` join nodes follow the last tree.
Rows admit different numbers of cells (`Ftau` keeps those above its threshold), so their
decompositions differ; an admission never loops over rows: the trees every row needs, of
every size, are built in one batched call (`build_trees`, one pass per segment width: the
segments of one width are split together whatever tree they belong to), and the join chains
of every row are written at once (`write_join_chains`: cumulative sums along the bits). A tree of
n cells costs `O(n log n)` (linear-time median splits per level), so the whole build is
`O(M log^2 M)` per row, never an `N x M` tensor.
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
        w = torch.matmul(x.transpose(-1, -2), torch.matmul(x, u[..., None]))[..., 0]  # X^T (X u)
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
    return build_trees([(kbar, a, p, cells)])[0]


TreeInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def build_trees(groups: list[TreeInputs]) -> list[dict[str, torch.Tensor]]:
    """`build_chunk_trees` of several groups of chunks at once, each group `(kbar, a, p, cells)` of
    its own size `2^k`. A node's split reads only its segment, so the segments of one width are
    split together whatever tree they belong to: the roots of the smaller trees with the deeper
    levels of the larger ones. The ops run once per width (`log2` of the largest size `+ 1`
    passes) instead of once per level of every size, the same numbers per segment."""
    sizes = [kbar.shape[1] for kbar, *_ in groups]
    if any(n < 1 or n & (n - 1) for n in sizes):
        raise ValueError(f"a chunk holds a power of two cells, got {sizes}")
    if not groups:
        return []
    dim = groups[0][0].shape[-1]
    levels: list[dict[str, list[torch.Tensor]]] = [{"mu": [], "rho": [], "amax": [], "pmin": []} for _ in groups]
    leaves: list[torch.Tensor] = [torch.empty(0)] * len(groups)
    entering = sorted(range(len(groups)), key=lambda i: -sizes[i])  # the largest trees start first
    members: list[int] = []  # the groups with segments in `x`, in row order
    segments: list[int] = []  # segments per chunk of each member at this width
    x = ap = ids = None  # [T, width, ...]: every segment of this width, member by member, in heap order
    width = sizes[entering[0]]
    while True:
        while entering and sizes[entering[0]] == width:  # these groups' roots have this width
            i = entering.pop(0)
            kbar, a, p, cells = groups[i]
            new = (kbar, torch.stack((a, p.to(a.dtype)), dim=-1), cells)  # a and p travel together
            x, ap, ids = new if x is None else (torch.cat((old, part)) for old, part in zip((x, ap, ids), new))
            members.append(i)
            segments.append(1)
        rows = [groups[i][0].shape[0] for i in members]
        mu = x.mean(dim=1)
        centered = x - mu[:, None]
        dist = torch.linalg.vector_norm(centered, dim=-1)  # T width
        stats = {"mu": mu, "rho": dist.amax(dim=-1), "amax": ap[..., 0].amax(dim=-1), "pmin": ap[..., 1].amin(dim=-1)}
        counts = [g * s for g, s in zip(rows, segments)]
        for name, value in stats.items():
            for i, g, s, piece in zip(members, rows, segments, value.split(counts)):
                levels[i][name].append(piece.view(g, s, *piece.shape[1:]))
        if width == 1:
            for i, g, s, piece in zip(members, rows, segments, ids[:, 0].split(counts)):
                leaves[i] = piece.view(g, s)
            break
        # the farthest cell starts the power iteration (argmax: the earliest among equals)
        far = dist.argmax(dim=-1)
        u0 = centered.gather(1, far[:, None, None].expand(-1, 1, dim))[:, 0]
        proj = torch.matmul(centered, power_iteration(centered, u0)[..., None])[..., 0]  # T width
        half = width // 2  # ceil(m/2) = m/2 for a power of two
        kth = proj.kthvalue(half, dim=-1, keepdim=True).values
        below, tied = proj < kth, proj == kth
        need = half - below.sum(dim=-1, keepdim=True)
        left = below | (tied & (tied.cumsum(dim=-1) <= need))  # ties on the median: earlier cells go left
        # stable partition: left cells first, each side in arrival order; each segment becomes two
        dest = torch.where(left, left.cumsum(dim=-1) - 1, half + (~left).cumsum(dim=-1) - 1)
        x = torch.empty_like(x).scatter_(1, dest[..., None].expand(-1, -1, dim), x).reshape(-1, half, dim)
        ap = torch.empty_like(ap).scatter_(1, dest[..., None].expand(-1, -1, 2), ap).reshape(-1, half, 2)
        ids = torch.empty_like(ids).scatter_(1, dest, ids).reshape(-1, half)
        segments = [2 * s for s in segments]
        width = half
    trees = []
    for (kbar, _, _, cells), parts, leaf in zip(groups, levels, leaves):
        tree = {name: torch.cat(values, dim=1) for name, values in parts.items()}
        tree["cell"] = torch.cat((cells.new_full((kbar.shape[0], kbar.shape[1] - 1), -1), leaf), dim=1)
        trees.append(tree)
    return trees


NODE_FIELDS = ("mu", "rho", "amax", "pmin", "left", "right", "cell")
STATS, LINKS = ("rho", "amax", "pmin"), ("left", "right", "cell")


class NodeStore:
    """Node buffers of G forests side by side, `[G, capacity, ...]`, so one beam search can
    gather from all of them at once. Capacity doubles when a forest needs more (amortized
    O(1) copies per node).

    Three buffers: `mu [G, cap, d]`, `stats [G, cap, 3]` (rho, amax, pmin) and `links
    [G, cap, 3]` (left, right, cell; -1 = none), so a search step gathers a node's scalars in
    one read; `tensors` names each field (views of the buffers)."""

    def __init__(self, rows: int, dim: int, *, dtype: torch.dtype, device: torch.device, capacity: int = 16):
        self.rows, self.dim, self.dtype, self.device = rows, dim, dtype, device
        self.buffers: dict[str, torch.Tensor] = {}
        self._alloc(max(1, capacity), used=0)

    def _alloc(self, capacity: int, used: int) -> None:
        rows, kw = self.rows, dict(dtype=self.dtype, device=self.device)
        new = {"mu": torch.zeros(rows, capacity, self.dim, **kw), "stats": torch.zeros(rows, capacity, 3, **kw),
               "links": torch.full((rows, capacity, 3), -1, dtype=torch.long, device=self.device)}
        for name, old in self.buffers.items():
            new[name][:, :used] = old[:, :used]
        self.buffers = new
        self.tensors = {"mu": new["mu"], **{name: new["stats"][..., i] for i, name in enumerate(STATS)},
                        **{name: new["links"][..., i] for i, name in enumerate(LINKS)}}

    @property
    def capacity(self) -> int:
        return self.buffers["mu"].shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers.values())

    def reserve(self, nodes: int) -> None:
        """Room for `nodes` nodes in every row."""
        capacity = self.capacity
        if nodes > capacity:
            while capacity < nodes:
                capacity *= 2
            self._alloc(capacity, used=self.capacity)


class Forests:
    """The forests of `rows` rows (batch row x head x forest kind) over the cells each admitted so
    far (module docstring), grown together.

    Per row: the admitted cells in arrival order with their summaries (`ids`, `kbar`, `a`,
    `p`, first `count[row]` columns valid), the node arrays in `store` (first
    `2 count - 1` valid) and `root` (-1 while empty).
    """

    def __init__(self, rows: int, dim: int, *, dtype: torch.dtype, device: torch.device, capacity: int = 16):
        self.store = NodeStore(rows, dim, dtype=dtype, device=device, capacity=2 * capacity)
        self.count = torch.zeros(rows, dtype=torch.long, device=device)
        self.root = torch.full((rows,), -1, dtype=torch.long, device=device)
        self.kbar = torch.zeros(rows, capacity, dim, dtype=dtype, device=device)
        self.a = torch.zeros(rows, capacity, dtype=dtype, device=device)
        self.p = torch.zeros(rows, capacity, dtype=dtype, device=device)
        self.ids = torch.full((rows, capacity), -1, dtype=torch.long, device=device)

    @property
    def rows(self) -> int:
        return self.count.shape[0]

    @property
    def nbytes(self) -> int:
        tensors = (self.count, self.root, self.kbar, self.a, self.p, self.ids)
        return self.store.nbytes + sum(t.numel() * t.element_size() for t in tensors)

    def _reserve_cells(self, cells: int) -> None:
        capacity = self.ids.shape[1]
        if cells <= capacity:
            return
        while capacity < cells:
            capacity *= 2
        for name in ("kbar", "a", "p", "ids"):
            old = getattr(self, name)
            new = old.new_full((old.shape[0], capacity, *old.shape[2:]), -1 if name == "ids" else 0)
            new[:, : old.shape[1]] = old
            setattr(self, name, new)

    def admit(self, kbar: torch.Tensor, a: torch.Tensor, p: torch.Tensor, ids: torch.Tensor,
              keep: torch.Tensor) -> None:
        """Append the newly eligible cells `ids [n]` (ascending, after every admitted one) that each
        row keeps: kbar `[R, n, d]`, a `[R, n]`, p `[n]` or `[R, n]`, keep `[R, n]` bool."""
        old = self.count
        new = old + keep.sum(dim=1)
        changed = new != old
        if not bool(changed.any()):
            return
        most = int(new.max())
        self._reserve_cells(most)
        self.store.reserve(2 * most - 1)
        rows = torch.arange(self.rows, device=keep.device)[:, None].expand_as(keep)[keep]
        cols = (old[:, None] + keep.long().cumsum(dim=1) - 1)[keep]
        self.kbar[rows, cols] = kbar[keep].to(self.kbar.dtype)
        self.a[rows, cols] = a[keep].to(self.a.dtype)
        self.p[rows, cols] = p.to(self.p.dtype).expand_as(keep)[keep]
        self.ids[rows, cols] = ids.expand_as(keep)[keep]
        self.count = new
        # a row builds its chunk of 2^bit cells when its new decomposition has one that the old did not
        # (the same size after the same larger chunks: the same chunk, kept)
        bits = torch.arange(most.bit_length(), device=new.device)
        has = (new[:, None] >> bits) & 1 == 1
        kept = ((old[:, None] >> bits) & 1 == 1) & ((old[:, None] >> (bits + 1)) == (new[:, None] >> (bits + 1)))
        build = has & ~kept & changed[:, None]
        offsets, trees_end = _chunk_offsets(new, most.bit_length())
        # every size's trees in one build (`build_trees`)
        bits = build.any(dim=0).nonzero().flatten().tolist()
        rows = [build[:, bit].nonzero().squeeze(1) for bit in bits]
        trees = build_trees([chunk_inputs(self.kbar, self.a, self.p, self.ids, at, new[at] >> (bit + 1) << (bit + 1),
                                          bit) for bit, at in zip(bits, rows)])
        for bit, at, tree in zip(bits, rows, trees):
            write_trees(self.store.tensors, at, offsets[at, bit], tree)
        # the changed rows' join chains, after their last tree
        top = write_join_chains(self.store.tensors, torch.arange(self.rows, device=new.device), new, trees_end,
                                offsets, taking_part=changed)
        self.root = torch.where(changed, top, self.root)


def chunk_inputs(kbar: torch.Tensor, a: torch.Tensor, p: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                 first: torch.Tensor, bit: int) -> TreeInputs:
    """What the chunks of `2^bit` cells of `rows [P]` are built from (`build_trees`): of each row's
    admitted cells (kbar `[R, C, d]`, a, p, ids `[R, C]`, in arrival order), cells `[first, first + 2^bit)`,
    `first [P]`. A forest of `c` cells from admitted cell 0 holds it at `first = (c >> (bit + 1)) << (bit + 1)`
    (the larger chunks first); a document's forest, at that offset from the document's first cell."""
    cells = first[:, None] + torch.arange(1 << bit, device=rows.device)
    r = rows[:, None]
    return kbar[r, cells], a[r, cells], p[r, cells], ids[r, cells]


def write_trees(t: dict[str, torch.Tensor], rows: torch.Tensor, offset: torch.Tensor, tree: dict) -> None:
    """Store chunk trees (`build_chunk_trees`, one per entry of `rows [P]`) in the node fields `t`
    (`NodeStore.tensors`) of those rows, each from node slot `offset [P]` on, in heap order."""
    nodes = tree["cell"].shape[1]
    r, offset = rows[:, None], offset[:, None]
    heap = torch.arange(nodes, device=rows.device)
    slots = offset + heap
    for name in ("mu", "rho", "amax", "pmin", "cell"):
        t[name][r, slots] = tree[name]
    internal = heap < nodes // 2  # a perfect tree's first (n - 1) / 2 nodes have children
    t["left"][r, slots] = torch.where(internal, offset + 2 * heap + 1, -1)
    t["right"][r, slots] = torch.where(internal, offset + 2 * heap + 2, -1)


def write_join_chains(t: dict[str, torch.Tensor], row: torch.Tensor, count: torch.Tensor, slot: torch.Tensor,
                      roots: torch.Tensor, *, taking_part: torch.Tensor | None = None) -> torch.Tensor:
    """Join chains: J_r = root(G_r); J_t joins root(G_t) and J_{t+1}, smallest chunk first; J_1 is the
    forest's root (triangle-bound radius). For forests in rows `row [P]` of `count [P]` cells, whose
    chunk of `2^b` cells (where bit b of the count is set) has its root at slot `roots [P, bits]`, the
    join nodes from slot `slot [P]` on, in the order they are made (smallest chunk first); only the
    entries `taking_part` (default: all) are joined. Returns each chain's top, the forest's root (the
    smallest chunk's root where nothing is joined, -1 for an empty forest).

    Every chain at once, along the bits: a join's mean is the cell-weighted mean of the chunks up to it
    (a cumulative sum), its radius the triangle bound `max(|mu_G - mu_J| + rho_G, |mu_J' - mu_J| +
    rho_J')` over the join below it, J', unrolled into a running maximum (`rho_J = max over the chain's
    chunks G up to J of (|mu_G - mu_J_G| + rho_G - E_G) + E_J`, E the summed steps between joins),
    `A` and `pmin` a running max and min."""
    bits = roots.shape[1]
    sizes = torch.arange(bits, device=count.device)
    low = lowest_bit(count)  # the smallest chunk, as a bit (-1: empty)
    below = torch.where(count > 0, roots.gather(1, low.clamp_min(0)[:, None])[:, 0], -1)
    chain = ((count[:, None] >> sizes) & 1 == 1) & (count[:, None] > 0)  # the chunks, smallest first
    joins = chain & (low[:, None] < sizes)  # a join node over each chunk above the smallest
    if taking_part is not None:
        joins &= taking_part[:, None]
    if not bool(joins.any()):
        return below
    r = row[:, None].expand(-1, bits)
    at = torch.where(chain, roots, 0)
    mu_g = t["mu"][r, at]  # P bits d
    cells = torch.where(chain, 1 << sizes, 0).to(mu_g.dtype)  # P bits
    mu = (cells[..., None] * mu_g).cumsum(dim=1) / cells.cumsum(dim=1).clamp_min(1)[..., None]  # J at each bit
    # the mean moves at each join (and stays, exactly, at a bit without a chunk); none before the chain
    step = torch.linalg.vector_norm(mu[:, 1:] - mu[:, :-1], dim=-1) * (sizes[1:] > low[:, None])
    walked = torch.cat((step.new_zeros(step.shape[0], 1), step), dim=1).cumsum(dim=1)  # E
    reach = torch.linalg.vector_norm(mu_g - mu, dim=-1) + t["rho"][r, at] - walked
    rho = torch.where(chain, reach, float("-inf")).cummax(dim=1).values + walked
    amax = torch.where(chain, t["amax"][r, at], float("-inf")).cummax(dim=1).values
    pmin = torch.where(chain, t["pmin"][r, at], float("inf")).cummin(dim=1).values
    rank = joins.long().cumsum(dim=1) - 1
    node = slot[:, None] + rank  # P bits: the join over each chunk (where `joins`)
    under = torch.where(rank > 0, node - 1, below[:, None])  # the join below it, or the smallest chunk
    rj, nj = r[joins], node[joins]
    t["mu"][rj, nj] = mu[joins]
    t["rho"][rj, nj], t["amax"][rj, nj], t["pmin"][rj, nj] = rho[joins], amax[joins], pmin[joins]
    t["left"][rj, nj], t["right"][rj, nj], t["cell"][rj, nj] = roots[joins], under[joins], -1
    return torch.where(joins.any(dim=1), slot + joins.sum(dim=1) - 1, below)


def _chunk_offsets(count: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For rows of `count` cells: the first node slot of the chunk of `2^bit` cells, `[R, bits]`
    (the trees of the larger chunks before it take `2 size - 1` slots each; meaningless where the
    row has no such chunk), and the slot after every chunk tree, `[R]`; one popcount for all."""
    shifts = torch.arange(bits + 1, device=count.device)
    higher = count[:, None] >> shifts  # [R, bits + 1]: count >> (bit + 1) is column bit + 1
    ones = _popcount(higher)
    return 2 * (higher[:, 1:] << shifts[1:]) - ones[:, 1:], 2 * count - ones[:, 0]


def _popcount(x: torch.Tensor) -> torch.Tensor:
    """Set bits of each entry of a non-negative int64 tensor: bit counts of pairs, nibbles and bytes
    summed in place (no loop over the bits, no multiply that could overflow)."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    x = x + (x >> 8)
    x = x + (x >> 16)
    x = x + (x >> 32)
    return x & 0x7F


def lowest_bit(x: torch.Tensor) -> torch.Tensor:
    """Index of the lowest set bit of each entry (-1 for 0)."""
    low = x & -x
    return torch.where(x > 0, torch.log2(low.clamp_min(1).double()).round().long(), -1)
