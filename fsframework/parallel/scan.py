"""Sequence parallelism for language models that own their SP form (AR-GRC, docs/argrc.md §6).

The model computes (`sharded_hidden_states`); this module supplies the one collective it
needs: every rank's block roots, `[K_r, B, D]` per rank, gathered from all ranks of the SP
group. Backward sums the gradients every rank put on a root and returns them to its owner.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from fsframework.parallel.collective_time import SP_COLLECTIVES
from fsframework.parallel.collectives import CommCounter
from fsframework.parallel.context import SPContext


class _GatherRoots(torch.autograd.Function):
    @staticmethod
    def forward(ctx, roots: torch.Tensor, sp: SPContext):
        counts = [torch.zeros(1, dtype=torch.long, device=roots.device) for _ in range(sp.size)]
        with SP_COLLECTIVES.timing(roots.device):
            dist.all_gather(counts, torch.tensor([roots.shape[0]], device=roots.device), group=sp.group)
        ctx.sp, ctx.counts = sp, [int(c) for c in counts]
        padded = _pad(roots, max(ctx.counts))
        out = [torch.empty_like(padded) for _ in range(sp.size)]
        with SP_COLLECTIVES.timing(padded.device):
            dist.all_gather(out, padded, group=sp.group)
        CommCounter.add("all_gather", (sp.size - 1) * padded.numel() * padded.element_size())
        return tuple(part[:count] for part, count in zip(out, ctx.counts))

    @staticmethod
    def backward(ctx, *grads):
        sp, most = ctx.sp, max(ctx.counts)
        some = next(g for g in grads if g is not None)  # backward runs only when one part has a gradient
        own = None
        for r, (grad, count) in enumerate(zip(grads, ctx.counts)):
            grad = some.new_zeros(count, *some.shape[1:]) if grad is None else grad
            padded = _pad(grad, most)
            with SP_COLLECTIVES.timing(padded.device):
                dist.reduce(padded, dst=sp.peers[r], group=sp.group)  # every rank's gradient on rank r's roots
            CommCounter.add("reduce", padded.numel() * padded.element_size())
            if r == sp.rank:
                own = padded[:count]
        return own, None


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat((x, x.new_zeros(rows - x.shape[0], *x.shape[1:]))).contiguous()


def root_gatherer(sp: SPContext):
    """`gather_roots` for a model's `sharded_hidden_states`: own `[K, B, D]` -> every rank's `[K_r, B, D]`."""
    return lambda roots: list(_GatherRoots.apply(roots, sp))
