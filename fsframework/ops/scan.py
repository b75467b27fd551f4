"""Exclusive prefix scan over a balanced binary tree with an arbitrary (learned) combine.

The Blelloch scan of docs/argrc.md §2: an up-sweep combines adjacent pairs level by
level and keeps every level; a down-sweep starts from the identity at the root, a left
child receiving its parent's value and a right child `combine(parent value, up-sweep
value of its left sibling)`. The combine need not be associative, so the tree is part
of the definition: the row at `t` is `combine(...combine(combine(e, S_1), S_2)..., S_m)`
over the dyadic blocks `S_1 .. S_m` of `t` (largest first), each block reduced by its
own balanced tree. The tree is aligned at position 0 and only complete blocks are ever
formed, so a row depends on neither the total length nor anything after it, and any
length works without padding.

Legend: B batch, N positions, D width, M rows handed to one combine call.
"""

from __future__ import annotations

from typing import Callable

import torch

from fsf_kernels.common.tree_tables import TreeTables

Combine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _checked(combine: Combine, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`combine(a, b)` on `[B, m, D]` operands as one batched call on `[B * m, D]` rows."""
    batch, m, width = a.shape
    out = combine(a.reshape(batch * m, width), b.reshape(batch * m, width))
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (batch * m, width):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"combine must map two [M, D] = [{batch * m}, {width}] tensors to [M, D], returned {got}")
    return out.reshape(batch, m, width)


def up_sweep(x: torch.Tensor, combine: Combine) -> list[torch.Tensor]:
    """Every level of the up-sweep: level `l` `[B, N // 2**l, D]` holds the roots of the
    complete aligned blocks of `2**l` positions (level 0 is `x`). One combine call per level."""
    levels = [x]
    while levels[-1].shape[1] >= 2:
        below = levels[-1]
        pairs = below.shape[1] // 2
        levels.append(_checked(combine, below[:, 0:2 * pairs:2], below[:, 1:2 * pairs:2]))
    return levels


def down_sweep(levels: list[torch.Tensor], combine: Combine, initial: torch.Tensor) -> torch.Tensor:
    """The exclusive prefixes `[B, N, D]` from the up-sweep `levels` of `N` positions, the
    root receiving `initial` `[B, D]`. One combine call per level."""
    n = levels[0].shape[1]
    height = max(n - 1, 0).bit_length()  # the root block 2**height covers [0, n)
    values = initial[:, None, :]  # values of the nodes at level `height` that start before n
    for level in range(height - 1, -1, -1):
        count = -(-n // 2**level)  # nodes of this level starting before n
        rights = count // 2  # right children: their left siblings are complete blocks
        right_values = _checked(combine, values[:, :rights], levels[level][:, 0:2 * rights:2])
        if count % 2:  # the last node is a left child without a right sibling
            right_values = torch.cat((right_values, values[:, -1:]), dim=1)
        values = torch.stack((values[:, :(count + 1) // 2], right_values), dim=2).flatten(1, 2)[:, :count]
    return values


def exclusive_scan(x: torch.Tensor, combine: Combine, identity: torch.Tensor) -> torch.Tensor:
    """Exclusive tree prefixes of `x` `[B, N, D]` under `combine` (docs/argrc.md §2).

    combine: maps two `[M, D]` tensors to `[M, D]`; called once per tree level on all the
    pairs of that level (`2 * ceil(log2 N)` calls in all, `O(N)` rows).
    identity: `[D]` (the value at the root, e.g. a learned vector), or `[B, D]` (one per
    sequence: the prefix of the positions before this slice under sequence parallelism).
    Returns `[B, N, D]`; row `t` covers positions `< t` (row 0 is the identity).
    """
    if x.ndim != 3:
        raise ValueError(f"x must be [B, N, D], got shape {tuple(x.shape)}")
    batch, _, width = x.shape
    if identity.shape == (width,):
        identity = identity.expand(batch, width)
    elif identity.shape != (batch, width):
        raise ValueError(f"identity must be [D] = [{width}] or [B, D] = [{batch}, {width}], "
                         f"got shape {tuple(identity.shape)}")
    if x.shape[1] == 0:
        return x
    return down_sweep(up_sweep(x, combine), combine, identity.to(x.dtype))


def row_tiled(combine: Combine, rows: int) -> Combine:
    """`combine` applied to tiles of at most `rows` rows, written into one `[M, D]` output.

    The same function row by row (the combine is position-wise); only the working set of one
    call shrinks. Why: a cell's hidden layer is `4D` wide, so a level of `M` pairs allocates
    `[M, 4D]` intermediates. Past the allocator's fresh-mapping threshold (32 MiB in glibc)
    every such buffer is mapped and zeroed by the kernel anew on each call, and past the
    last-level cache each elementwise pass streams from memory: time per row then grows with
    `N` (docs/argrc.md §8 measures it). Tiles that fit in cache keep the CPU time per row
    constant. Meant for passes without autograd: with a graph, tiles would add a node each.
    """
    if rows < 1:
        raise ValueError(f"rows per tile must be positive, got {rows}")

    def tiled(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.shape[0] <= rows:
            return combine(a, b)
        head = combine(a[:rows], b[:rows])  # its dtype and width are the output's (autocast, bad shapes)
        out = head.new_empty((a.shape[0], *head.shape[1:]))
        out[:rows] = head
        for first in range(rows, a.shape[0], rows):
            out[first:first + rows] = combine(a[first:first + rows], b[first:first + rows])
        return out

    return tiled



def packed_exclusive_scan(leaves: torch.Tensor, tables: TreeTables, combine: Combine,
                          identity: torch.Tensor) -> torch.Tensor:
    """`exclusive_scan` of many sequences laid end to end in `leaves` `[R0, D]` (sequence `s` its
    `n_s` rows), each in its own tree, in one tree's worth of combine calls (`2 * ceil(log2 max n_s)`):
    `tables` (`fsf_kernels.common.tree_tables.tree_tables(n)`) say which rows pair up at each level.
    identity `[D]`, each sequence's root value. Returns `[R0, D]`: the exclusive prefixes of each
    sequence, equal to `exclusive_scan` of the sequences one by one (the same rows combined)."""
    if leaves.ndim != 2 or leaves.shape[0] != tables.leaves:
        raise ValueError(f"leaves must be [R0, D] with R0 = {tables.leaves} (the tables' sequences), "
                         f"got shape {tuple(leaves.shape)}")
    width = leaves.shape[1]
    if identity.shape != (width,):
        raise ValueError(f"identity must be [D] = [{width}], got shape {tuple(identity.shape)}")
    identity = identity.to(leaves.dtype)

    def pairs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _checked(combine, a[None], b[None])[0] if a.shape[0] else a

    levels = [leaves]
    for left in tables.up_left:
        below = levels[-1]
        levels.append(pairs(below[left], below[left + 1]))
    values = identity.expand(tables.roots, width)
    top = len(tables.down_parent)
    for step, (parent, sibling, gather) in enumerate(zip(tables.down_parent, tables.down_sibling,
                                                         tables.down_gather)):
        right = pairs(values[parent], levels[top - 1 - step][sibling])
        values = torch.cat((values, right, identity[None]))[gather]
    return values
