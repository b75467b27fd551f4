"""The whole tree scan with the Triton GRC cell and a hand-written backward (docs/argrc.md §2).

Forward keeps every up-sweep level and every down-sweep level (all `D` wide: `O(N D)` in
total); the cell's `4D`-wide activations are never stored. Backward walks the tree in
reverse: the down-sweep from the leaves to the root (a left child's gradient goes to its
parent; a right child's through the cell to its parent and to its left sibling's up-sweep
value), then the up-sweep from the root to the leaves. One cell launch per level each way.

Legend: B batch, N positions, D width.
"""

from __future__ import annotations

import torch

from fsf_kernels.grc_scan.cell import accumulating_backward, cell_params, grc_cell_fwd


class GRCTreeScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, identity, eps, *params):
        x = x.contiguous()
        batch, n, d = x.shape
        cell = lambda a, b: grc_cell_fwd(a, b, params, eps).view(a.shape)  # noqa: E731  (views read in place)
        ups = [x]
        while ups[-1].shape[1] >= 2:
            pairs = ups[-1].shape[1] // 2
            ups.append(cell(ups[-1][:, 0:2 * pairs:2], ups[-1][:, 1:2 * pairs:2]))
        height = max(n - 1, 0).bit_length()
        values = identity.expand(batch, d).to(x.dtype)[:, None]
        downs = []  # downs[l]: the values of level l + 1, the parents of level l
        for level in range(height - 1, -1, -1):
            count = -(-n // 2**level)
            rights = count // 2
            downs.insert(0, values)
            right = cell(values[:, :rights], ups[level][:, 0:2 * rights:2])
            if count % 2:
                right = torch.cat((right, values[:, -1:]), dim=1)
            values = torch.stack((values[:, :(count + 1) // 2], right), dim=2).flatten(1, 2)[:, :count]
        ctx.eps, ctx.n, ctx.identity_shape, ctx.levels, ctx.n_params = eps, n, identity.shape, len(ups), len(params)
        ctx.save_for_backward(*params, *ups, *downs)
        return values

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        k = ctx.n_params
        params, ups, downs = saved[:k], saved[k:k + ctx.levels], saved[k + ctx.levels:]
        eps, n = ctx.eps, ctx.n
        cell_backward, param_grads = accumulating_backward(params, eps)

        grad_ups = [torch.zeros(u.shape, device=u.device, dtype=torch.float32) for u in ups]
        g = grad.float()
        for level, parents in enumerate(downs):  # the down-sweep, leaves first
            count = g.shape[1]
            rights = count // 2
            g_parents = g[:, 0::2].clone()  # left children hand their gradient to the parent
            if rights:
                da, db = cell_backward(parents[:, :rights], ups[level][:, 0:2 * rights:2], g[:, 1::2])
                g_parents[:, :rights] += da
                grad_ups[level][:, 0:2 * rights:2] += db
            g = g_parents
        grad_identity = g[:, 0]
        for level in range(len(ups) - 1, 0, -1):  # the up-sweep, root first
            below = ups[level - 1]
            pairs = ups[level].shape[1]
            da, db = cell_backward(below[:, 0:2 * pairs:2], below[:, 1:2 * pairs:2], grad_ups[level])
            grad_ups[level - 1][:, 0:2 * pairs:2] += da
            grad_ups[level - 1][:, 1:2 * pairs:2] += db
        if len(ctx.identity_shape) == 1:
            grad_identity = grad_identity.sum(0)
        return (grad_ups[0].to(grad.dtype), grad_identity, None,
                *(pg.to(p.dtype) for pg, p in zip(param_grads, params)))


def grc_exclusive_scan(x: torch.Tensor, cell, identity: torch.Tensor) -> torch.Tensor:
    """`fsframework.ops.scan.exclusive_scan(x, cell, identity)` for a GRC cell module (with or
    without its post-merge network): `x` `[B, N, D]`, `identity` `[D]` or `[B, D]` -> `[B, N, D]`."""
    if x.shape[1] == 0:
        return x
    return GRCTreeScan.apply(x, identity, cell.norm.eps, *cell_params(cell, x.dtype))
