"""Block-aligned sharding of a sequence over the ranks of a sequence-parallel group.

A sequence of `N` tokens is cut into `ceil(N / B)` query blocks of `B` tokens
(the last one may be short). Rank `r` of `sp` owns a contiguous run of whole
blocks: the blocks are dealt as evenly as possible, earlier ranks taking the one
extra block when `ceil(N / B)` is not a multiple of `sp`. Whole blocks matter
for FreeSolo: every query of a block shares one eligible-cell set, so a block
never straddles two ranks and routing stays exactly the single-process routing.

Layouts (`parallel.sp_layout`): `contiguous` gives rank `r` the `r`-th of `sp` runs,
so with causal attention the last rank does the most work (about `2 - 1/sp` times
the mean); `zigzag` (ring-flash-attn, Llama 3 context parallelism) cuts `2 sp` runs
and gives rank `r` runs `r` and `2 sp - 1 - r`: an early and a late run, the same
causal work on every rank up to a block.

With packed documents read apart a query's work grows with its place in its document, not
in the row, so no fixed pairing balances every batch: `document_runs` cuts `4 sp` chunks
and deals them 4 to a rank by their masked work (the heaviest chunk first, to the rank with
the least work so far). On one document per row that is the zigzag pairing; on rows of mixed
documents it keeps every rank within a few percent of the mean where zigzag's two runs leave
up to 1.4x (`tools/bench_sp.py --only work --documents mix`). Every rank holds the same
number of chunks, so the same number of tokens up to a block.
"""

from __future__ import annotations

import torch


def block_slices(seq_len: int, sp: int, block_size: int) -> list[tuple[int, int]]:
    """`[(start, end), ...]` token ranges of the `sp` ranks, contiguous, covering `[0, seq_len)`.

    Raises ValueError when there are fewer query blocks than ranks (some rank would own nothing).
    """
    if sp < 1 or block_size < 1:
        raise ValueError(f"sp={sp} and block_size={block_size} must be >= 1")
    num_blocks = -(-seq_len // block_size)
    if num_blocks < sp:
        raise ValueError(f"a sequence of {seq_len} tokens has {num_blocks} query blocks of "
                         f"model.attention.block_size={block_size}, fewer than parallel.sp={sp}: "
                         "use longer sequences, a smaller block size or a smaller parallel.sp")
    base, extra = divmod(num_blocks, sp)
    slices, block = [], 0
    for r in range(sp):
        count = base + (1 if r < extra else 0)
        start, block = block * block_size, block + count
        slices.append((start, min(block * block_size, seq_len)))
    return slices


LAYOUTS = ("contiguous", "zigzag")


def layout_runs(seq_len: int, sp: int, block_size: int, layout: str) -> list[list[tuple[int, int]]]:
    """`runs[r]`: the token ranges of rank `r`, in position order (one for contiguous, two for zigzag).

    Raises ValueError for an unknown layout or when some rank would own no block.
    """
    if layout == "contiguous":
        return [[span] for span in block_slices(seq_len, sp, block_size)]
    if layout != "zigzag":
        raise ValueError(f"parallel.sp_layout={layout!r} is not one of {LAYOUTS}")
    if -(-seq_len // block_size) < 2 * sp:  # too short to cut 2 sp runs: one slice each, unbalanced anyway
        return layout_runs(seq_len, sp, block_size, "contiguous")
    chunks = block_slices(seq_len, 2 * sp, block_size)
    return [[chunks[r], chunks[2 * sp - 1 - r]] for r in range(sp)]


CHUNKS_PER_RANK = 4  # `document_runs`: 2 (zigzag's count) leaves mixed documents up to 1.4x the mean


def document_runs(positions: torch.Tensor, sp: int, block_size: int,
                  chunks_per_rank: int = CHUNKS_PER_RANK) -> list[list[tuple[int, int]]]:
    """`runs[r]` of rank `r` for rows whose tokens sit at `positions` `[B, N]` inside their documents: `sp`
    times `chunks_per_rank` chunks of whole blocks (fewer where the rows have fewer blocks), each rank
    given as many, the heaviest first to the least loaded rank, by causal work within the documents
    (a query at position `p` scores `p + 1` keys); adjacent chunks of a rank merge into one run.
    Ties go to the lower rank, so every rank computes the same runs from the same rows."""
    num_blocks = -(-positions.shape[1] // block_size)
    count = max(1, min(chunks_per_rank, num_blocks // sp))
    chunks = block_slices(positions.shape[1], count * sp, block_size)
    work = [int((positions[:, a:b] + 1).sum()) for a, b in chunks]
    load, owned = [0] * sp, [[] for _ in range(sp)]
    for chunk in sorted(range(len(chunks)), key=lambda i: (-work[i], i)):
        rank = min((r for r in range(sp) if len(owned[r]) < count), key=lambda r: (load[r], r))
        load[rank] += work[chunk]
        owned[rank].append(chunks[chunk])
    runs = []
    for own in owned:
        merged: list[tuple[int, int]] = []
        for a, b in sorted(own):
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        runs.append(merged)
    return runs


def causal_work(runs: list[tuple[int, int]]) -> int:
    """Score elements of causal attention for queries of `runs`: query `i` scores keys `[0, i]`."""
    return sum((e * (e + 1) - s * (s + 1)) // 2 for s, e in runs)


def shard(x: torch.Tensor, span: tuple[int, int], dim: int = 1) -> torch.Tensor:
    """The `[start, end)` slice of `x` along `dim` (the sequence axis)."""
    start, end = span
    return x.narrow(dim, start, end - start)


def shard_runs(x: torch.Tensor, runs: list[tuple[int, int]], dim: int = 1) -> torch.Tensor:
    """The `runs` of `x` along `dim`, concatenated in order: a rank's own tokens under any layout."""
    if len(runs) == 1:
        return shard(x, runs[0], dim)
    return torch.cat([shard(x, run, dim) for run in runs], dim=dim)
