"""Batch sources: where the training loop takes its micro-batches from.

The loop asks its source for each micro-batch and, at a checkpoint, for its position:

- `next_batch(step, micro)`: a dict of `[B, T]` tensors, `inputs`, `targets` (-100: not
  scored) and, for recall weighting or a weighted task, `weights`. `step` is the number of
  optimizer steps taken before this one, `micro` the micro-batch within the step: a source
  that generates its batches seeds from them, a stream ignores them.
- `state_dict()` / `load_state_dict(state)`: the position, saved in every checkpoint's loop
  state (under "loader") so that a resumed run reads on exactly where the run stopped.
- `record(step)`: what the step's metrics line says about the batches besides their
  length (which the loop reads off the batch), e.g. whether they were the copy warmup's.
- `close()`: the loop is done with the source (the end of `fit`, also on an error): a
  source that reads ahead in background threads stops them.

The sources: text shards (`fsframework.data.loader.TokenLoader`), associative recall
(`data.source=mqar`, `fsframework.data.mqar.RecallTaskLoader`), and three that change what
another source serves during the first steps: `ShortSequences` (`train.short_seq_*`, here),
the copy warmup (`research.copy_warmup_*`, `fsframework.data.copy_warmup`) and the induction
warm-up (`data.warmup.*`, `fsframework.data.warmups`). `fsframework.data.source_table`
chooses them from the config for the trainer. A test or an experiment that wants other batches
(an injected fault, a drill) registers a source or a wrapper there, and the loop stays as it is.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

Batch = dict[str, torch.Tensor]


class BatchSource(Protocol):
    def next_batch(self, step: int, micro: int) -> Batch:
        ...

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...

    def record(self, step: int) -> dict[str, Any]:
        ...

    def close(self) -> None:
        ...


class StreamSource:
    """A source that is an endless iterator of batches (`__next__`), whatever the step."""

    def next_batch(self, step: int, micro: int) -> Batch:
        return next(self)

    def record(self, step: int) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class WrappedSource:
    """A source that changes what `inner` serves; its position is `inner`'s, so checkpoints hold
    the same loop state with or without the wrapper."""

    def __init__(self, inner: BatchSource):
        self.inner = inner

    def next_batch(self, step: int, micro: int) -> Batch:
        return self.inner.next_batch(step, micro)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def close(self) -> None:
        self.inner.close()

    def record(self, step: int) -> dict[str, Any]:
        return self.inner.record(step)


def cut_sequences(batch: Batch, length: int) -> Batch:
    """Every `[B, T]` tensor of the batch as `[B * T / length, length]` (the same tokens in shorter
    sequences; recall weights keep their full-sample values)."""
    return {key: value.reshape(-1, length) if value.dim() == 2 else value for key, value in batch.items()}


class ShortSequences(WrappedSource):
    """Sequence-length warmup (`train.short_seq_len`, `train.short_seq_steps`): during the first
    `steps` steps every batch of `inner` is cut into sequences of `length` tokens."""

    def __init__(self, inner: BatchSource, length: int, steps: int):
        super().__init__(inner)
        self.length, self.steps = length, steps

    def next_batch(self, step: int, micro: int) -> Batch:
        batch = self.inner.next_batch(step, micro)
        return cut_sequences(batch, self.length) if step < self.steps else batch
