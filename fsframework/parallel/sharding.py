"""Block-aligned sharding of a sequence over the ranks of a sequence-parallel group.

A sequence of `N` tokens is cut into `ceil(N / B)` query blocks of `B` tokens
(the last one may be short). Rank `r` of `sp` owns a contiguous run of whole
blocks: the blocks are dealt as evenly as possible, earlier ranks taking the one
extra block when `ceil(N / B)` is not a multiple of `sp`. Whole blocks matter
for FreeSolo: every query of a block shares one eligible-cell set, so a block
never straddles two ranks and routing stays exactly the single-process routing.
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


def shard(x: torch.Tensor, span: tuple[int, int], dim: int = 1) -> torch.Tensor:
    """The `[start, end)` slice of `x` along `dim` (the sequence axis)."""
    start, end = span
    return x.narrow(dim, start, end - start)
