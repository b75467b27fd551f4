"""AR-GRC under document masking and sequence parallelism: a continued document's block roots, not its leaves.

A run's first piece that continues a document at position `o` of it needs the prefix state of the
document's `[0, o)`: the fold of the cell over the roots of the aligned dyadic blocks that tile it,
in the document's own coordinates (its tree starts at its start, docs/argrc.md §2). Those leaves lie
on other ranks, and a block may cross a rank's boundary (a document starts anywhere). So each block
is halved until every part lies in one rank's run; the rank holding a part reduces its root from its
own leaves (an up-sweep, one cell call per level for all parts of a size) and sends that one vector;
the continuing rank rebuilds each block's root from its halves (`prefixes_of_slice`), the same tree as
one process's. A block that crosses no boundary is one root: a document that spans whole slices
moves one root per rank before the piece, what the unmasked form moves; a block crossing a boundary
adds at most one root per level on each side.

Every rank plans every rank's part alike from the whole rows' `doc_ids` (`plan_roots`), so the
messages match; the roots travel by `exchange_rows` (backward returns their gradients to the ranks
whose leaves made them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fsframework.models.argrc_blocks import aligned_blocks
from fsframework.ops.scan import up_sweep
from fsframework.parallel.rank_layout import RankLayout, Transport, continued_runs, exchange_rows

Part = tuple[int, int, int]  # (row, first column on its rank, size): leaves whose root one rank reduces


@dataclass(frozen=True)
class RootsPlan:
    """One rank's part of the exchange of continued documents' roots (`plan_roots`).

    `reduce`: the parts whose roots this rank reduces from its leaves (for its own pieces and for its
    peers'), in one order; `sends[peer]`: indices into `reduce` of the roots the message to `peer` holds;
    `recvs[peer]`: how many roots `peer` sends; `pieces[i]`: for this rank's `i`-th continued piece, its
    blocks `(first, size)` in document coordinates and where each root comes from: `("own", j)` (the
    `j`-th of `reduce`) or `("recv", j)` (the `j`-th received, peers in order)."""

    reduce: tuple[Part, ...]
    sends: tuple[tuple[int, tuple[int, ...]], ...]
    recvs: tuple[tuple[int, int], ...]
    pieces: tuple[tuple[tuple[tuple[int, int], tuple[str, int]], ...], ...]


def _parts(layout: RankLayout, doc_start: int, first: int, size: int) -> list[tuple[int, int, int, int]]:
    """The aligned block `(first, size)` of a document beginning at row position `doc_start`, halved until
    each part lies in one run: `(first, size, rank, column)` of each part, left to right."""
    lo = doc_start + first
    held = layout.split(lo, lo + size)
    if len(held) == 1:
        rank, column, _, _ = held[0]
        return [(first, size, rank, column)]
    half = size // 2
    return _parts(layout, doc_start, first, half) + _parts(layout, doc_start, first + half, half)


def plan_roots(positions: torch.Tensor, all_runs: list[list[tuple[int, int]]], rank: int) -> RootsPlan:
    """Rank `rank`'s part of the exchange in which each continued piece (row by row, runs in order:
    `Documents.continuations`' order) receives the roots of its document's `[0, o)`. `positions` `[B, N]`:
    each token's place in its document, of the whole rows (the same on every rank)."""
    layout = RankLayout(all_runs)
    reduce: dict[Part, int] = {}
    sends: dict[int, list[int]] = {}
    recvs: dict[int, int] = {}
    pieces = []

    def reduced(part: Part) -> int:
        return reduce.setdefault(part, len(reduce))

    for dst, runs in enumerate(all_runs):
        for row, starts in enumerate(continued_runs(positions, runs)):
            for (a, _), start in zip(runs, starts):
                if not start:
                    continue
                blocks = []
                for block in aligned_blocks(0, start):
                    for first, size, src, column in _parts(layout, a - start, *block):
                        part = (row, column, size)
                        if src == rank and dst == rank:
                            blocks.append(((first, size), ("own", reduced(part))))
                        elif src == rank:
                            sends.setdefault(dst, []).append(reduced(part))
                        elif dst == rank:
                            blocks.append(((first, size), ("recv", src, recvs.get(src, 0))))
                            recvs[src] = recvs.get(src, 0) + 1
                if dst == rank:
                    pieces.append(blocks)
    # a received root's index among all received ones: peers in order, each peer's roots in order
    offsets, total = {}, 0
    for peer in sorted(recvs):
        offsets[peer], total = total, total + recvs[peer]
    pieces = tuple(tuple((block, ("recv", offsets[where[1]] + where[2]) if where[0] == "recv" else where)
                         for block, where in blocks) for blocks in pieces)
    return RootsPlan(tuple(reduce), tuple((p, tuple(i)) for p, i in sorted(sends.items())),
                     tuple(sorted(recvs.items())), pieces)


def reduce_roots(h: torch.Tensor, parts: tuple[Part, ...], combine) -> torch.Tensor:
    """The roots `[len(parts), D]` of the leaves `h` `[B, n, D]` of each part `(row, column, size)`: one
    up-sweep per size, over every part of that size at once."""
    roots: list = [None] * len(parts)
    for size in sorted({size for _, _, size in parts}):
        chosen = [i for i, (_, _, s) in enumerate(parts) if s == size]
        leaves = torch.stack([h[row, column:column + size] for row, column, _ in (parts[i] for i in chosen)])
        for i, root in zip(chosen, up_sweep(leaves, combine)[-1][:, 0]):
            roots[i] = root
    # none: still a slice of `h`, so that the exchange after it runs its backward on every rank
    return torch.stack(roots) if roots else h.reshape(-1, h.shape[-1])[:0]


def continued_roots(h: torch.Tensor, plan: RootsPlan, combine, transport: Transport
                    ) -> tuple[torch.Tensor, list[dict[tuple[int, int], torch.Tensor]]]:
    """This rank's leaves `h` `[B, n, D]` -> (the roots it received `[R, D]`, for each of its continued
    pieces the roots `{(first, size): [1, D]}` of its document's `[0, o)`, halves where a block crosses
    a boundary). Every rank calls it, also with nothing to send or receive (it is an exchange)."""
    own = reduce_roots(h, plan.reduce, combine)
    outgoing = own[torch.tensor([i for _, indices in plan.sends for i in indices], dtype=torch.long,
                                device=h.device)]
    sends = tuple((peer, len(indices)) for peer, indices in plan.sends)
    received = exchange_rows(outgoing, sends, plan.recvs, transport)
    source = {"own": own, "recv": received}
    known = [{block: source[where[0]][where[1]][None] for block, where in blocks} for blocks in plan.pieces]
    return received, known
