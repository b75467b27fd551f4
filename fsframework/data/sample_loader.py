"""A torch DataLoader over a StreamingDataset that resumes where it stopped.

mosaicml-streaming's own `StreamingDataLoader` does the same, but its module imports transformers
(for two `isinstance` checks on batch types fsframework never produces): 2.3 s of CPU at the start
of every rank. This one counts the samples it hands out and asks the dataset for its state the
same way (`StreamingDataset.state_dict(num_samples, from_beginning=False)`), so checkpoints of
either loader resume alike.
"""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader


class SampleCountingLoader(DataLoader):
    """DataLoader whose `state_dict` is the dataset's position after the batches handed out this
    epoch (every batch a dict of `[batch, ...]` tensors)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.num_samples_yielded = 0

    def __iter__(self) -> Iterator[Any]:
        self.num_samples_yielded = 0
        for batch in super().__iter__():
            self.num_samples_yielded += len(next(iter(batch.values())))
            yield batch

    def state_dict(self) -> dict[str, Any]:
        from streaming.base.world import World

        # the dataset's position counts the samples of every rank; ranks that share their
        # samples (`replication`: a sequence-parallel group) count once
        num_samples = self.num_samples_yielded * World.detect().num_ranks
        if self.dataset.replication is not None:
            num_samples //= self.dataset.replication
        return self.dataset.state_dict(num_samples, False)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
