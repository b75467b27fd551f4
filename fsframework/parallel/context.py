"""What a sequence-parallel rank knows of its group and of the sequence it processes.

`parallelize` makes one `SPContext` per model: the group, the block size and the layout.
`SPContext.at_length(N)` is that context for one sequence of `N` tokens: it adds every
rank's runs. `fsframework.parallel.batch.shard_batch` makes it while cutting a batch, and
the forward pass takes it as an argument and hands it to every attention layer through
the key source, so nothing is set during a forward pass and read after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from fsframework.models.documents import document_positions
from fsframework.parallel.groups import ParallelGroups
from fsframework.parallel.sharding import document_runs, layout_runs


@dataclass
class SPContext:
    """SP group membership plus, once `at_length` gave a sequence length, its block-aligned runs.

    `all_runs[r]`: the token ranges of SP rank `r` (`fsframework.parallel.sharding`), one
    under the contiguous layout, two under zigzag (up to four for rows of packed documents read
    apart, `at_documents`); `runs` are this rank's. The contiguous
    layout's `slices[r] = (start, end)` and this rank's `start`/`end` are what the halo and
    retained-cell exchanges use.
    """

    groups: ParallelGroups
    block_size: int
    layout: str = "contiguous"
    all_runs: list[list[tuple[int, int]]] = field(default_factory=list)
    seq_len: int = 0

    def at_length(self, seq_len: int) -> "SPContext":
        """This context for a sequence of `seq_len` tokens, cut into this group's runs (the same on
        every rank); `self` is left as it is."""
        return replace(self, all_runs=layout_runs(seq_len, self.size, self.block_size, self.layout), seq_len=seq_len)

    def at_documents(self, doc_ids: torch.Tensor) -> "SPContext":
        """This context for rows whose packed documents are `doc_ids` `[B, N]`, read apart: the zigzag
        layout's runs dealt by the rows' masked work (`document_runs`); the contiguous layout's as
        `at_length`'s. The same on every rank, which reads the same rows."""
        if self.layout != "zigzag":
            return self.at_length(doc_ids.shape[1])
        runs = document_runs(document_positions(doc_ids.cpu()), self.size, self.block_size)
        return replace(self, all_runs=runs, seq_len=doc_ids.shape[1])

    def _every_rank_runs(self) -> list[list[tuple[int, int]]]:
        if not self.all_runs:
            raise ValueError("this SPContext has no sequence: take SPContext.at_length(seq_len)")
        return self.all_runs

    @property
    def runs(self) -> list[tuple[int, int]]:
        return self._every_rank_runs()[self.rank]

    @property
    def slices(self) -> list[tuple[int, int]]:
        if any(len(runs) != 1 for runs in self._every_rank_runs()):
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
