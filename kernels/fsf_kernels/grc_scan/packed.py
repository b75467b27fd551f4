"""The tree scan of many sequences laid end to end, with the Triton GRC cell: one cell launch per
level each way however many sequences (docs/argrc.md §2, "Packed documents").

The same walk as `fsf_kernels.grc_scan.tree` (every level kept, hand-written backward), with the
gathers of `fsf_kernels.common.tree_tables` in place of the single tree's strided views: each level's
operands are gathered from the level below, and in backward their gradients are scattered back
(`index_add_`) to the rows they were gathered from.

Legend: R0 leaves of all sequences, D width.
"""

from __future__ import annotations

import torch

from fsf_kernels.grc_scan.cell import accumulating_backward, cell_params, grc_cell_fwd
from fsf_kernels.common.tree_tables import TreeTables


class GRCPackedTreeScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, identity, tables: TreeTables, eps, *params):
        x = x.contiguous()
        width = x.shape[1]
        cell = lambda a, b: grc_cell_fwd(a, b, params, eps).view(a.shape)  # noqa: E731
        ups = [x]
        for left in tables.up_left:
            below = ups[-1]
            ups.append(cell(below[left], below[left + 1]) if left.numel() else below[:0])
        identity = identity.to(x.dtype)
        values = identity.expand(tables.roots, width)
        parents = []  # the values above each down-sweep step, top first
        top = len(tables.down_parent)
        for step, (parent, sibling, gather) in enumerate(zip(tables.down_parent, tables.down_sibling,
                                                             tables.down_gather)):
            parents.append(values)
            right = cell(values[parent], ups[top - 1 - step][sibling]) if parent.numel() else values[:0]
            values = torch.cat((values, right, identity[None]))[gather]
        ctx.eps, ctx.tables, ctx.levels, ctx.n_params = eps, tables, len(ups), len(params)
        ctx.save_for_backward(*params, *ups, *parents)
        return values

    @staticmethod
    def backward(ctx, grad):
        saved, tables, eps = ctx.saved_tensors, ctx.tables, ctx.eps
        k = ctx.n_params
        params, ups, parents = saved[:k], saved[k:k + ctx.levels], saved[k + ctx.levels:]
        cell_backward, param_grads = accumulating_backward(params, eps)

        grad_ups = [torch.zeros(u.shape, device=u.device, dtype=torch.float32) for u in ups]
        grad_identity = grad.new_zeros(grad.shape[1], dtype=torch.float32)
        g = grad.float()
        top = len(tables.down_parent)
        for step in range(top - 1, -1, -1):  # the down-sweep, leaves first
            above, parent, sibling = parents[step], tables.down_parent[step], tables.down_sibling[step]
            rights = parent.numel()
            g_source = g.new_zeros(above.shape[0] + rights + 1, g.shape[1]).index_add_(0, tables.down_gather[step], g)
            g_above, g_right = g_source[:above.shape[0]], g_source[above.shape[0]:-1]
            grad_identity += g_source[-1]
            if rights:
                level = top - 1 - step
                da, db = cell_backward(above[parent], ups[level][sibling], g_right)
                g_above.index_add_(0, parent, da)
                grad_ups[level].index_add_(0, sibling, db)
            g = g_above
        grad_identity += g.sum(0)  # the roots: copies of the identity
        for level in range(len(ups) - 1, 0, -1):  # the up-sweep, root first
            left = tables.up_left[level - 1]
            if not left.numel():
                continue
            below = ups[level - 1]
            da, db = cell_backward(below[left], below[left + 1], grad_ups[level])
            grad_ups[level - 1].index_add_(0, left, da)
            grad_ups[level - 1].index_add_(0, left + 1, db)
        return (grad_ups[0].to(grad.dtype), grad_identity, None, None,
                *(pg.to(p.dtype) for pg, p in zip(param_grads, params)))


def grc_packed_exclusive_scan(leaves: torch.Tensor, tables: TreeTables, cell, identity: torch.Tensor) -> torch.Tensor:
    """`fsframework.ops.scan.packed_exclusive_scan(leaves, tables, cell, identity)` for a GRC cell
    module: `leaves` `[R0, D]`, `identity` `[D]` -> `[R0, D]`."""
    return GRCPackedTreeScan.apply(leaves, identity, tables, cell.norm.eps, *cell_params(cell, leaves.dtype))
