"""Where the positions of packed rows lie under sequence parallelism, and the messages between ranks.

A rank holds runs of every row laid end to end (`fsframework.parallel.sharding`); `RankLayout` says which
rank holds a position and at which of its columns. `exchange_rows` moves rows of a tensor between ranks
point to point, differentiably: what document masking sends for the pieces that continue a document
(`fsframework.parallel.documents`, `document_roots`).
"""

from __future__ import annotations

import bisect
from typing import Callable

import torch

# moves the messages of one exchange: (outgoing [(peer, tensor)], incoming [(peer, buffer to fill)])
Transport = Callable[[list, list], None]


class RankLayout:
    """Which rank holds each position of the rows, and at which of its columns (its runs end to end)."""

    def __init__(self, all_runs: list[list[tuple[int, int]]]):
        self.all_runs = all_runs
        owned = []
        for rank, runs in enumerate(all_runs):
            column = 0
            for a, b in runs:
                owned.append((a, b, rank, column))
                column += b - a
        self.owned = sorted(owned)
        self.starts = [a for a, *_ in self.owned]

    def split(self, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        """`[lo, hi)` cut at the runs: `(rank, column, lo, hi)` for each run it touches, in order."""
        out, i = [], bisect.bisect_right(self.starts, lo) - 1
        while lo < hi:
            a, b, rank, column = self.owned[i]
            end = min(hi, b)
            out.append((rank, column + lo - a, lo, end))
            lo, i = end, i + 1
        return out


def continued_runs(positions: torch.Tensor, runs: list[tuple[int, int]]) -> list[list[int]]:
    """`[B][runs]`: the position inside its document of each run's first token (0: it starts one)."""
    return [[int(positions[row, a]) for a, _ in runs] for row in range(positions.shape[0])]


class _Exchange(torch.autograd.Function):
    """Messages between the ranks: `outgoing` `[S, ...]` laid end to end, `sends` `(peer, rows)` in order
    -> what the peers sent, `recvs` `(peer, rows)` in order, laid end to end. Backward sends every
    gradient back the way its rows came."""

    @staticmethod
    def forward(ctx, outgoing: torch.Tensor, sends: tuple, recvs: tuple, transport: Transport):
        ctx.sends, ctx.recvs, ctx.transport = sends, recvs, transport
        messages = [(peer, part) for (peer, _), part in zip(sends, outgoing.split([n for _, n in sends]))]
        incoming = [(peer, outgoing.new_empty((n, *outgoing.shape[1:]))) for peer, n in recvs]
        transport(messages, incoming)
        return torch.cat([outgoing[:0]] + [t for _, t in incoming])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        messages = [(peer, part) for (peer, _), part in zip(ctx.recvs, grad.split([n for _, n in ctx.recvs]))]
        incoming = [(peer, grad.new_empty((n, *grad.shape[1:]))) for peer, n in ctx.sends]
        ctx.transport(messages, incoming)
        return torch.cat([grad[:0]] + [t for _, t in incoming]), None, None, None


def exchange_rows(outgoing: torch.Tensor, sends: tuple, recvs: tuple, transport: Transport) -> torch.Tensor:
    """`_Exchange` (differentiable): `outgoing` rows to `sends`' peers -> the rows `recvs`' peers sent."""
    return _Exchange.apply(outgoing, sends, recvs, transport)


def cell_inputs(x: torch.Tensor, cells, cell_size: int) -> torch.Tensor:
    """The inputs `[C, s, D]` of a rank's cells `(cell, row, first column)` in its part `x` `[B, n, D]`, in
    one gather (an index built on the host, not a slice per cell)."""
    firsts = torch.tensor([row * x.shape[1] + column for _, row, column in cells], dtype=torch.long)
    index = (firsts[:, None] + torch.arange(cell_size)).to(x.device)
    return x.reshape(-1, x.shape[-1])[index]


def held_cells(x: torch.Tensor, cells, cell_size: int, project) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values `[C, s, H, d]` of a rank's cells `(cell, row, first column)` in its part `x`, projected
    by `project(x, start) -> q, k, v` (FreeSolo's keys are unrotated: the position does not matter)."""
    _, k, v = project(cell_inputs(x, cells, cell_size).reshape(1, -1, x.shape[-1]), 0)
    return k.reshape(len(cells), cell_size, *k.shape[2:]), v.reshape(len(cells), cell_size, *v.shape[2:])
