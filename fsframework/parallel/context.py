"""Per-model sequence-parallel state shared by the wrapped modules of one model.

The top-level model sets the slices of the sequence it is about to process
(`begin`); every attention layer reads its own span and its peers' spans from
the same object, so no layer needs the sequence length passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsframework.parallel.groups import ParallelGroups
from fsframework.parallel.sharding import layout_runs


@dataclass
class SPContext:
    """SP group membership plus the block-aligned runs of the current sequence.

    `all_runs[r]`: the token ranges of SP rank `r` (`fsframework.parallel.sharding`), one
    under the contiguous layout, two under zigzag; `runs` are this rank's. The contiguous
    layout's `slices[r] = (start, end)` and this rank's `start`/`end` are what the halo and
    retained-cell exchanges use.
    """

    groups: ParallelGroups
    block_size: int
    layout: str = "contiguous"
    all_runs: list[list[tuple[int, int]]] = field(default_factory=list)
    seq_len: int = 0

    def begin(self, seq_len: int) -> None:
        """Cut a sequence of `seq_len` tokens into this group's runs (same on every rank)."""
        if seq_len != self.seq_len or not self.all_runs:
            self.all_runs = layout_runs(seq_len, self.size, self.block_size, self.layout)
            self.seq_len = seq_len

    @property
    def runs(self) -> list[tuple[int, int]]:
        return self.all_runs[self.rank]

    @property
    def slices(self) -> list[tuple[int, int]]:
        if any(len(runs) != 1 for runs in self.all_runs):
            raise ValueError(f"the {self.layout} layout gives ranks several runs, not one slice each")
        return [runs[0] for runs in self.all_runs]

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
