"""Per-model sequence-parallel state shared by the wrapped modules of one model.

The top-level model sets the slices of the sequence it is about to process
(`begin`); every attention layer reads its own span and its peers' spans from
the same object, so no layer needs the sequence length passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsframework.parallel.groups import ParallelGroups
from fsframework.parallel.sharding import block_slices


@dataclass
class SPContext:
    """SP group membership plus the block-aligned slices of the current sequence.

    `slices[r] = (start, end)`: tokens of SP rank `r`; `start`/`end` are this rank's.
    """

    groups: ParallelGroups
    block_size: int
    slices: list[tuple[int, int]] = field(default_factory=list)
    seq_len: int = 0

    def begin(self, seq_len: int) -> None:
        """Cut a sequence of `seq_len` tokens into this group's slices (same on every rank)."""
        if seq_len != self.seq_len or not self.slices:
            self.slices = block_slices(seq_len, self.size, self.block_size)
            self.seq_len = seq_len

    @property
    def size(self) -> int:
        return self.groups.sp

    @property
    def rank(self) -> int:
        return self.groups.sp_rank

    @property
    def group(self):
        return self.groups.sp_group

    @property
    def peers(self) -> list[int]:
        """Global ranks of the SP group, indexed by SP rank (point-to-point calls take global ranks)."""
        return self.groups.sp_ranks

    @property
    def start(self) -> int:
        return self.slices[self.rank][0]

    @property
    def end(self) -> int:
        return self.slices[self.rank][1]

    @property
    def span(self) -> tuple[int, int]:
        return self.slices[self.rank]
