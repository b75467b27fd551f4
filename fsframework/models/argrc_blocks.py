"""AR-GRC's aligned dyadic blocks: the tree math that sequence parallelism and cached decoding
share (docs/argrc.md §5, §6). A slice of a sequence is cut into aligned blocks, each reduced
by an up-sweep; the prefix at any position is the fold of the cell over the roots of the
blocks that tile the positions before it. The communication is the caller's.

Legend: B batch, n positions of a slice, D scan width.
"""

from __future__ import annotations

import torch

from fsframework.ops.scan import down_sweep, up_sweep


def aligned_blocks(start: int, end: int) -> list[tuple[int, int]]:
    """`[start, end)` as the fewest aligned dyadic blocks `(first, size)`, left to right
    (`size` a power of two dividing `first`): at most `2 log2(end - start) + 2` of them."""
    blocks, pos = [], start
    while pos < end:
        size = pos & -pos if pos else 1 << (end - 1).bit_length()
        while pos + size > end:
            size //= 2
        blocks.append((pos, size))
        pos += size
    return blocks


def sharded_inclusive_prefixes(h: torch.Tensor, combine, identity: torch.Tensor, slices: list[tuple[int, int]],
                               rank: int, gather_roots) -> torch.Tensor:
    """`inclusive_prefixes` of the slice `slices[rank]` of a sequence from its leaves `h` only
    (docs/argrc.md §6). Each rank cuts its slice into aligned blocks and reduces them; ranks
    exchange those roots (D numbers per block and sequence); every root of a larger aligned
    block before the slice is then computed redundantly from them, the prefix at each local
    block start is the fold over its dyadic blocks, and the down-sweep inside a block is local.
    """
    start, end = slices[rank]
    local = aligned_blocks(start, end)
    levels = [up_sweep(h[:, first - start:first - start + size], combine) for first, size in local]
    own_roots = torch.stack([lv[-1][:, 0] for lv in levels]) if levels else h.new_zeros(0, h.shape[0], h.shape[2])
    gathered = gather_roots(own_roots)
    known: dict[tuple[int, int], torch.Tensor] = {}
    for r, (s, e) in enumerate(slices):
        # this rank's own roots too come from the gather: every rank's backward then runs the
        # gather's backward, which returns the other ranks' gradients on its roots
        for i, block in enumerate(aligned_blocks(s, e)):
            known[block] = gathered[r][i]
    return prefixes_of_slice(combine, identity, h.shape[0], start, local, levels, known)[0]


def continued_inclusive_prefixes(known: dict[tuple[int, int], torch.Tensor], h: torch.Tensor, start: int, combine,
                                 identity: torch.Tensor) -> torch.Tensor:
    """The inclusive prefixes `[B, m, D]` of leaves `h` `[B, m, D]` at positions `[start, start + m)` of a
    document whose earlier part `[0, start)` is given by `known`: roots `[B, D]` of aligned blocks that tile
    it, or of their halves (document masking under sequence parallelism: a piece that continues a
    document begun elsewhere, whose roots other ranks reduced, `fsframework.parallel.document_roots`).
    The piece is then the slice `[start, start + m)` of `sharded_inclusive_prefixes`."""
    known = dict(known)
    local = aligned_blocks(start, start + h.shape[1])
    levels = [up_sweep(h[:, first - start:first - start + size], combine) for first, size in local]
    for (first, size), lv in zip(local, levels):
        known[(first, size)] = lv[-1][:, 0]
    return prefixes_of_slice(combine, identity, h.shape[0], start, local, levels, known)[0]


def prefixes_of_slice(combine, identity: torch.Tensor, batch: int, start: int, local: list[tuple[int, int]],
                      levels: list[list[torch.Tensor]], known: dict[tuple[int, int], torch.Tensor]):
    """The inclusive prefixes `[batch, n, D]` of the positions `[start, start + n)` cut into the aligned
    blocks `local` with their up-sweep `levels`, given `known`: the roots of aligned blocks, at
    least those that tile `[0, start)` and the local ones. Also returns `root(first, size)`,
    which computes (and keeps in `known`) the root of any aligned block inside
    `[0, start + n)` from its halves."""
    end = start + sum(size for _, size in local)

    def root(first: int, size: int) -> torch.Tensor:
        if (first, size) not in known:  # a block over several known blocks: from its halves
            half = size // 2
            known[(first, size)] = combine(root(first, half), root(first + half, half))
        return known[(first, size)]

    def prefix(position: int) -> torch.Tensor:
        value, first = identity.expand(batch, -1), 0
        for bit in reversed(range(position.bit_length())):
            if position >> bit & 1:
                value = combine(value, root(first, 1 << bit))
                first += 1 << bit
        return value

    parts = [down_sweep(lv, combine, prefix(first)) for lv, (first, _) in zip(levels, local)]
    exclusive = torch.cat(parts + [prefix(end)[:, None]], dim=1)  # exclusive prefixes at start .. end
    return exclusive[:, 1:], root
