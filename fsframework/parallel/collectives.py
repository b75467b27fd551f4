"""Autograd-aware sequence collectives for sequence parallelism, with a byte counter.

Legend: B batch, n own slice length, L longest slice, N sequence, W halo width;
`...` are trailing feature axes (heads, head width).

- `gather_sequence(x [B, n, ...]) -> [B, upto, ...]`: the sequence `[0, upto)` from
  every rank's slice; `gather_runs` the same for one run of every rank (zigzag layout), into
  one buffer per layer call that the runs share.
  Forward: all-gather of the slices (padded to `L`). Backward: reduce-scatter (sum), so
  each rank receives the sum of the gradients that every rank's queries put on its own
  keys/values.
- `halo_exchange(x [B, n, ...], width) -> [B, W, ...]`: the `W = min(width, start)`
  tokens just before this rank's slice, by point-to-point messages from the
  earlier ranks that own them (a slice may be shorter than the halo, so a halo can
  span several ranks). Backward sends the halo's gradient back to its owners.

`CommCounter` tallies the bytes each rank RECEIVES per collective (all-gather
and ring reduce-scatter of a padded slice of `c` bytes over `p` ranks: `(p-1) c`;
point-to-point: the message), which is the traffic a real network carries.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.distributed as dist

from fsframework.parallel.context import SPContext
from fsframework.parallel.collective_time import SP_COLLECTIVES


class CommCounter:
    """Bytes received by this rank, per collective kind; enabled inside `counting()`."""

    enabled = False
    totals: dict[str, int] = defaultdict(int)

    @classmethod
    def add(cls, kind: str, num_bytes: int) -> None:
        if cls.enabled:
            cls.totals[kind] += int(num_bytes)

    @classmethod
    @contextmanager
    def counting(cls):
        cls.totals = defaultdict(int)
        cls.enabled = True
        try:
            yield cls.totals
        finally:
            cls.enabled = False


def num_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _pad_to(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad `[B, n, ...]` along the sequence axis to `length`."""
    if x.shape[1] == length:
        return x.contiguous()
    pad = x.new_zeros((x.shape[0], length - x.shape[1], *x.shape[2:]))
    return torch.cat((x, pad), dim=1)


def _all_gather_padded(x: torch.Tensor, sp: SPContext, slices: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Every rank's `x` `[B, n_r, ...]` (n_r its slice's length), each zero-padded to the longest slice:
    `sp x [B, L, ...]` in rank order, by one all-gather."""
    chunk = _pad_to(x, max(e - s for s, e in slices))
    out = [torch.empty_like(chunk) for _ in range(sp.size)]
    with SP_COLLECTIVES.timing(chunk.device):
        dist.all_gather(out, chunk, group=sp.group)
    CommCounter.add("all_gather", (sp.size - 1) * num_bytes(chunk))
    return out


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, sp: SPContext, slices: list[tuple[int, int]], upto: int):
        ctx.sp, ctx.slices, ctx.upto, ctx.own = sp, slices, upto, x.shape[1]
        out = _all_gather_padded(x, sp, slices)
        lo = min(s for s, _ in slices)
        parts = [out[r][:, : e - s] for r, (s, e) in sorted(enumerate(slices), key=lambda p: p[1]) if s < upto]
        return torch.cat(parts, dim=1)[:, : upto - lo]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _return_to_owners(grad, ctx.sp, ctx.slices, ctx.upto, ctx.own), None, None, None


def _return_to_owners(grad: torch.Tensor, sp: SPContext, slices: list[tuple[int, int]], upto: int,
                      own: int) -> torch.Tensor:
    """The gradient of gathered positions `[lo, upto)` (lo the first slice's start) -> this rank's
    `[B, own, ...]`: every rank's share of it, summed on its owner (one reduce-scatter)."""
    lo = min(s for s, _ in slices)
    longest = max(e - s for s, e in slices)
    shape = (grad.shape[0], longest, *grad.shape[2:])
    chunks = []
    for s, e in slices:  # every rank's share of this rank's gradient, padded; zeros past `upto`
        piece = grad[:, s - lo:max(s, min(e, upto)) - lo]
        chunks.append(_pad_to(piece, longest))
    mine = grad.new_empty(shape)
    with SP_COLLECTIVES.timing(mine.device):
        dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM, group=sp.group)
    CommCounter.add("reduce_scatter", (sp.size - 1) * num_bytes(mine))
    return mine[:, :own]


class _GatherRunInto(torch.autograd.Function):
    """Every rank's `run`-th run written into `buffer` `[B, N, ...]` at its positions; returns the
    buffer's `[0, upto)`. `before`, the previous run's output (`[0, lo)`), is an input only so that
    its positions' gradient goes back through it. The runs are written through `writer`
    (`buffer.data`: the same storage, its own version counter), so a later run's write does not
    invalidate what an earlier run's attention saved of the buffer for its backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, before: torch.Tensor, sp: SPContext, run: int, buffer: torch.Tensor,
                writer: torch.Tensor, upto: int):
        slices = [runs[run] for runs in sp.all_runs]
        ctx.sp, ctx.slices, ctx.upto, ctx.own, ctx.lo = sp, slices, upto, x.shape[1], before.shape[1]
        for part, (s, e) in zip(_all_gather_padded(x, sp, slices), slices):
            writer[:, s:e] = part[:, : e - s]
        return buffer[:, :upto]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        mine = _return_to_owners(grad[:, ctx.lo:], ctx.sp, ctx.slices, ctx.upto, ctx.own)
        return mine, grad[:, : ctx.lo], None, None, None, None, None


def gather_sequence(x: torch.Tensor, sp: SPContext, upto: int | None = None) -> torch.Tensor:
    """All slices of the sequence `[0, upto)` (default: up to this rank's end) -> `[B, upto, ...]`.

    x: this rank's slice `[B, end - start, ...]` (contiguous layout). Differentiable: gradients
    of the gathered tensor flow back to the rank that owns each position.
    """
    if x.shape[1] != sp.end - sp.start:
        raise ValueError(f"gather_sequence got a slice of {x.shape[1]} tokens, this rank owns {sp.end - sp.start}")
    if sp.size == 1:
        return x
    return _GatherSequence.apply(x, sp, sp.slices, sp.end if upto is None else upto)


def gather_runs(x: torch.Tensor, sp: SPContext, run: int, buffer: torch.Tensor,
                before: torch.Tensor | None = None) -> torch.Tensor:
    """Every rank's `run`-th run written into `buffer` `[B, N, ...]` (one per layer call, shared by its
    runs) -> the buffer's positions `[0, hi)`, `hi` the end of those runs together (zigzag: run 0
    covers `[0, M)`, run 1 `[M, N)`). `before`: the previous run's output, `[0, lo)`. So run 1's
    keys are not a second copy of run 0's: a rank holds `N` gathered positions, not `M + N`.

    x: this rank's `run`-th run `[B, end - start, ...]`. Differentiable like `gather_sequence`.
    """
    slices = [runs[run] for runs in sp.all_runs]
    start, end = slices[sp.rank]
    if x.shape[1] != end - start:
        raise ValueError(f"gather_runs got {x.shape[1]} tokens, run {run} of this rank has {end - start}")
    lo = min(s for s, _ in slices)
    before = x[:, :0] if before is None else before
    if before.shape[1] != lo:
        raise ValueError(f"run {run} starts at {lo}: it needs the previous runs' [0, {lo}), got {before.shape[1]}")
    return _GatherRunInto.apply(x, before, sp, run, buffer, buffer.data, max(e for _, e in slices))


def _halo_plan(sp: SPContext, width: int) -> tuple[list, list]:
    """(sends, recvs): `(peer SP rank, lo, hi)` global token ranges this rank sends / receives."""
    sends, recvs = [], []
    for dst, (dst_start, _) in enumerate(sp.slices):
        need_lo = max(0, dst_start - width)
        for src, (src_start, src_end) in enumerate(sp.slices):
            lo, hi = max(need_lo, src_start), min(dst_start, src_end)
            if src == dst or lo >= hi:
                continue
            if src == sp.rank:
                sends.append((dst, lo, hi))
            if dst == sp.rank:
                recvs.append((src, lo, hi))
    return sends, recvs


def exchange(sp: SPContext, outgoing: list[tuple[int, torch.Tensor]], incoming: list[tuple[int, torch.Tensor]],
              kind: str = "halo"):
    ops = [dist.P2POp(dist.isend, t.contiguous(), sp.peers[p], group=sp.group) for p, t in outgoing]
    ops += [dist.P2POp(dist.irecv, t, sp.peers[p], group=sp.group) for p, t in incoming]
    if ops:
        with SP_COLLECTIVES.timing(ops[0].tensor.device):
            for work in dist.batch_isend_irecv(ops):
                work.wait()
    for _, t in incoming:
        CommCounter.add(kind, num_bytes(t))


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, sp: SPContext, width: int):
        sends, recvs = _halo_plan(sp, width)
        ctx.sp, ctx.sends, ctx.recvs, ctx.shape = sp, sends, recvs, x.shape
        start = sp.start
        halo_lo = max(0, start - width)
        out = x.new_empty((x.shape[0], start - halo_lo, *x.shape[2:]))
        outgoing = [(dst, x[:, lo - start:hi - start]) for dst, lo, hi in sends]
        incoming = [(src, out[:, lo - halo_lo:hi - halo_lo]) for src, lo, hi in recvs]
        buffers = [(p, torch.empty_like(t)) for p, t in incoming]  # views are not contiguous in general
        exchange(sp, outgoing, buffers)
        for (_, view), (_, buf) in zip(incoming, buffers):
            view.copy_(buf)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        sp = ctx.sp
        start, halo_lo = sp.start, sp.start - grad.shape[1]
        grad_x = grad.new_zeros(ctx.shape)
        outgoing = [(src, grad[:, lo - halo_lo:hi - halo_lo]) for src, lo, hi in ctx.recvs]
        incoming = [(dst, grad.new_empty((grad.shape[0], hi - lo, *grad.shape[2:]))) for dst, lo, hi in ctx.sends]
        exchange(sp, outgoing, incoming)
        for (_, lo, hi), (_, buf) in zip(ctx.sends, incoming):
            grad_x[:, lo - start:hi - start] += buf
        return grad_x, None, None


def halo_exchange(x: torch.Tensor, sp: SPContext, width: int) -> torch.Tensor:
    """The `min(width, start)` tokens before this rank's slice -> `[B, W, ...]` (differentiable).

    x: this rank's slice `[B, end - start, ...]`.
    """
    if x.shape[1] != sp.end - sp.start:
        raise ValueError(f"halo_exchange got a slice of {x.shape[1]} tokens, this rank owns {sp.end - sp.start}")
    if sp.size == 1 or width <= 0:
        return x[:, :0]
    return _HaloExchange.apply(x, sp, width)
