"""FS-L's earlier keys: only the retained cells of the earlier ranks, a byte count constant in N.

Legend: B batch, n own slice length, H heads, d head width (keys and values travel
concatenated, `2d`), s cell size, P retained cells, W recent cells, w window,
a this rank's start, C_own own complete cells.

FS-L's available set for a query block is the `W` most recent cells plus the top-`P`
cells by the key-norm priority `a_c` (docs/freesolo.md §1.5). For every block of a
rank whose slice starts at `a`, the earlier-rank cells of its top-`P` lie in the
top-`P` of `[0, a)`: a cell that `P` cells of `[0, a)` outrank is outranked by them in
every longer prefix too (the order is `a_c` descending, the earlier cell first on
ties, the order `_route_fsl` keeps). So a rank fetches:

1. the halo: the `h` positions before `a`, `h = min(a, ceil(max(W s, w) / s) s)` (whole
   cells), for the recent cells and the local window;
2. per (batch, head), the top-`P` cells of `[0, a - h)`: every rank all-gathers its own
   top-`P` candidates (`a_c` and cell index, `P` pairs per head, constant in N) and
   merges them for every later rank, so each owner knows which of its cells each later
   rank needs and sends them without a request round.

Both travel as cells (`s` positions of one batch row and head), point to point: `P s + h`
positions per head, whatever N is. A cell comes from its owner or, where that evens out
what the ranks receive, from another rank that already fetched it from its owner
(`fsframework.parallel.cell_relays`): one exchange per layer and direction, two when some
cell is relayed.

`retained_kv` (the `keys` of a source) places the fetched positions in a zero prefix
`[B, a, H, 2d]`; the rest stays zero and is never read: a zero cell has `a_c = 0`, which no
fetched cell is below, and the earlier cell wins ties, so FS-L's routing keeps exactly the
single-process cells, and its readout and window read only fetched keys. What the model's
FS-L layers get is `retained_routed_kv` (the source's `freesolo_state`): the same fetch, the
routing done on the rank from the summaries of that zero prefix, and compact keys, the cells
the queries read and the halo (`fsframework.parallel.compact`), so a rank holds `O(P s + h)`
earlier positions per head instead of `a`. Backward returns each fetched cell's gradient to
its owner (through the relay that sent it, which adds its own).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from fsframework.models.context import CellRouter, RetainedCells
from fsframework.parallel.cell_relays import CellPlan, balance
from fsframework.parallel.collective_time import SP_COLLECTIVES
from fsframework.parallel.collectives import CommCounter, exchange, num_bytes
from fsframework.parallel.compact import Held, cells_of, compact_keys, local_positions
from fsframework.parallel.context import SPContext
from fsframework.ops.freesolo import select_cells_from_summaries, summarize_cells
from fsframework.ops.freesolo_routing import cell_summaries


def halo_width(span: RetainedCells) -> int:
    """Positions before `a` every rank takes whole: the recent cells and the window, in whole cells."""
    s = span.cell_size
    return -(-max(span.recent_cells * s, span.window) // s) * s


def _rank_order(values: torch.Tensor, cells: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `top` best of `values, cells` `[..., M]` (-1 cells invalid): `a_c` descending, earlier cell on ties."""
    values = values.masked_fill(cells < 0, float("-inf"))
    by_cell = torch.where(cells < 0, torch.iinfo(torch.long).max, cells).argsort(dim=-1, stable=True)
    values, cells = values.gather(-1, by_cell), cells.gather(-1, by_cell)
    best = values.argsort(dim=-1, descending=True, stable=True)[..., :top]
    return values.gather(-1, best), cells.gather(-1, best)


def _candidates(k: torch.Tensor, sp: SPContext, span: RetainedCells) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's own top-P cells by `a_c`: (values, cells) `[sp, B, H, P]`, cells -1 where a rank has fewer."""
    with torch.no_grad():
        a = cell_summaries(k, span.cell_size)[1].transpose(1, 2)  # B C_own H -> B H C_own
        first = sp.start // span.cell_size
        cells = torch.arange(first, first + a.shape[-1], device=k.device).expand_as(a)
        pad = max(0, span.retained_cells - a.shape[-1])
        a = torch.cat((a.double(), a.new_full((*a.shape[:-1], pad), float("-inf"), dtype=torch.float64)), dim=-1)
        cells = torch.cat((cells, cells.new_full((*cells.shape[:-1], pad), -1)), dim=-1)
        values, cells = _rank_order(a, cells, span.retained_cells)
        mine = torch.stack((values, cells.double()))  # cell indices are exact in float64
        every = [torch.empty_like(mine) for _ in range(sp.size)]
        with SP_COLLECTIVES.timing(mine.device):
            dist.all_gather(every, mine, group=sp.group)
        CommCounter.add("all_gather", (sp.size - 1) * num_bytes(mine))
        every = torch.stack(every, dim=1)  # 2 sp B H P
    return every[0], every[1].long()


def _plan(values: torch.Tensor, cells: torch.Tensor, sp: SPContext, span: RetainedCells):
    """`{(owner, target): (b, h, cell) long [count, 3]}`: the cells each target fetches from each owner,
    the same on every rank."""
    s, width = span.cell_size, halo_width(span)
    bsz, heads = values.shape[1:3]
    plan = {}
    for target, (a, _) in enumerate(sp.slices[1:], start=1):
        low = max(0, a - width)
        # the union of the earlier ranks' candidates holds the top-P of [0, a); cells in the halo come with it
        earlier = cells[:target].permute(1, 2, 0, 3).flatten(2)  # B H target*P
        vals = values[:target].permute(1, 2, 0, 3).flatten(2)
        _, best = _rank_order(vals, earlier, span.retained_cells)
        halo = torch.arange(low // s, a // s, device=best.device).expand(bsz, heads, -1)
        best = torch.cat((torch.where(best * s < low, best, -1), halo), dim=-1)
        picks = (best >= 0).nonzero()  # (b, h, slot), in (b, h, slot) order
        picked = torch.cat((picks[:, :2], best[picks[:, 0], picks[:, 1], picks[:, 2]][:, None]), dim=1)
        owners = torch.bucketize(picked[:, 2] * s, torch.tensor([e for _, e in sp.slices], device=picked.device),
                                 right=True)
        for owner in range(target):
            rows = picked[owners == owner]
            if rows.numel():
                plan[(owner, target)] = rows
    return plan


class FetchCells(torch.autograd.Function):
    """Own `kv [B, n, H, 2d]` -> the cells this rank fetches, `[m, s, 2d]` in `plan.rows_of(rank)`
    order: round 1 from their owners, round 2 from relays (`fsframework.parallel.cell_relays`).
    Backward runs the rounds in reverse: round-2 gradients go to the relays, which add them to
    the gradients of the cells they received in round 1 and return those to the owners.
    `held`: the position ranges `kv` holds, concatenated (default: this rank's slice)."""

    @staticmethod
    def forward(ctx, kv: torch.Tensor, sp: SPContext, plan: CellPlan, s: int, held: Held | None = None):
        held = held or [sp.span]
        ctx.sp, ctx.plan, ctx.s, ctx.shape, ctx.held = sp, plan, s, kv.shape, held
        me, width = sp.rank, kv.shape[-1]
        first = [(o, kv.new_empty((len(rows), s, width))) for o, rows in plan.received_by(me)]
        exchange(sp, [(t, cells_of(kv, rows, held, s)) for t, rows in plan.sent_by(me)], first, "cells")
        first = torch.cat([buf for _, buf in first]) if first else kv.new_empty((0, s, width))
        second = [(m, kv.new_empty((len(rows), s, width))) for m, rows in plan.received_by(me, relayed=True)]
        relayed = [(t, first[plan.sources[(me, t)]]) for t, _ in plan.sent_by(me, relayed=True)]
        if plan.relayed:  # the same on every rank: all take part in the round or none
            exchange(sp, relayed, second, "relayed cells")
        return torch.cat([first] + [buf for _, buf in second])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        sp, plan, s, me = ctx.sp, ctx.plan, ctx.s, ctx.sp.rank
        width = grad.shape[-1]
        received = plan.received_by(me)
        num_first = sum(len(rows) for _, rows in received)
        grad_first = grad[:num_first].clone()  # the relayed cells' gradients are added to it
        grad_second = grad[num_first:]
        if plan.relayed:
            senders = plan.received_by(me, relayed=True)
            pieces = grad_second.split([len(rows) for _, rows in senders]) if senders else []
            relayed = plan.sent_by(me, relayed=True)
            back = [(t, grad.new_empty((len(rows), s, width))) for t, rows in relayed]
            exchange(sp, [(m, piece) for (m, _), piece in zip(senders, pieces)], back, "relayed cells")
            for t, buf in back:
                grad_first.index_add_(0, plan.sources[(me, t)], buf)
        pieces = grad_first.split([len(rows) for _, rows in received]) if received else []
        mine = plan.sent_by(me)
        incoming = [(t, grad.new_empty((len(rows), s, width))) for t, rows in mine]
        exchange(sp, [(o, piece) for (o, _), piece in zip(received, pieces)], incoming, "cells")
        grad_kv = grad.new_zeros(ctx.shape)
        for (_, rows), (_, buf) in zip(mine, incoming):
            pos = local_positions(rows, s, ctx.held)
            grad_kv.index_put_((rows[:, :1], pos, rows[:, 1:2]), buf, accumulate=True)
        return grad_kv, None, None, None, None


def _fetch(k: torch.Tensor, v: torch.Tensor, sp: SPContext,
           span: RetainedCells) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Own `k, v` `[B, n, H, d]` -> (kv `[B, n, H, 2d]`, the fetched cells `[m, s, 2d]`, their rows
    (b, h, cell) `[m, 3]`): the halo and the earlier ranks' retained cells (module docstring)."""
    values, cells = _candidates(k, sp, span)
    plan = balance(_plan(values, cells, sp, span), sp.size)
    kv = torch.cat((k, v), dim=-1)  # B n H 2d
    fetched = FetchCells.apply(kv, sp, plan, span.cell_size)  # used even when empty: every rank runs its backward
    mine = plan.rows_of(sp.rank)
    rows = torch.cat(mine) if mine else torch.zeros((0, 3), dtype=torch.long, device=k.device)
    return kv, fetched, rows


def retained_kv(k: torch.Tensor, v: torch.Tensor, sp: SPContext,
                span: RetainedCells) -> tuple[torch.Tensor, torch.Tensor]:
    """Own `k, v` `[B, n, H, d]` -> `[B, a + n, H, d]` each: the halo and the earlier ranks' retained
    cells at their positions, zeros elsewhere before `a` (see the module docstring), then the own keys."""
    s = span.cell_size
    kv, fetched, rows = _fetch(k, v, sp, span)
    pos = local_positions(rows, s, [(0, sp.start)])  # m s
    prefix = kv.new_zeros((kv.shape[0], sp.start, *kv.shape[2:])).index_put((rows[:, :1], pos, rows[:, 1:2]), fetched)
    out = torch.cat((prefix, kv), dim=1)
    return out[..., : k.shape[-1]], out[..., k.shape[-1]:]


def retained_routed_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sp: SPContext, span: RetainedCells,
                       router: CellRouter) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`retained_kv`, routed here: own q, k, v `[B, n, H, d]` -> compact keys and values (the cells the
    queries read, the halo, the own keys; `fsframework.parallel.compact`) and the queries' cells.

    The same fetch as `retained_kv`; routing reads the summaries of what that zero-filled prefix
    would hold: the fetched cells' summaries at their places, zero elsewhere (a zero cell, `a_c = 0`,
    is never retained over a fetched one), then the own cells'. So the cells are those the layer
    routes from `retained_kv`'s keys, and the layer holds what they read instead of the prefix."""
    s, dim, settings = span.cell_size, k.shape[-1], router.settings
    kv, fetched, rows = _fetch(k, v, sp, span)
    kbar_own, a_own = summarize_cells(k, settings)  # B H C_own d, B H C_own
    kbar_cells, a_cells = summarize_cells(fetched[..., :dim].detach().unsqueeze(2), settings)  # m 1 1 d: a cell each
    kbar = kbar_own.new_zeros((*kbar_own.shape[:2], sp.start // s, dim))
    a = a_own.new_zeros((*a_own.shape[:2], sp.start // s))
    kbar[rows[:, 0], rows[:, 1], rows[:, 2]] = kbar_cells[:, 0, 0].to(kbar.dtype)
    a[rows[:, 0], rows[:, 1], rows[:, 2]] = a_cells[:, 0, 0].to(a.dtype)
    kbar, a = torch.cat((kbar, kbar_own), dim=2), torch.cat((a, a_own), dim=2)
    cells = select_cells_from_summaries(q, kbar, a, settings, router.prior, q_start=sp.start)
    tail = max(0, sp.start - halo_width(span))
    compact, cells = compact_keys(kv, fetched, rows, cells, [], sp.start, tail, s)
    return compact[..., :dim], compact[..., dim:], cells
