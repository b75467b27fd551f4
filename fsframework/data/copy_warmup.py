"""The copy warmup (`research.copy_warmup_*`, experiments/README.md): the first steps train on
repeated random passages (`fsframework.data.synthetic.repeat_batch`) in short sequences, then the
run's own source takes over where it stands (it is not read during the warmup)."""

from __future__ import annotations

from typing import Any

import torch

from fsframework.data.sources import Batch, BatchSource, WrappedSource
from fsframework.data.synthetic import repeat_batch


def copy_warmup_batch(cfg, step: int, micro: int, rank: int) -> Batch:
    """One micro-batch of the copy warmup of config `cfg`: repeated random passages with as many
    tokens as a data micro-batch. Drawn from a generator seeded by (seed, step, micro batch,
    rank), so a resumed run sees the same batches and ranks see different ones."""
    r = cfg.research
    gen = torch.Generator().manual_seed(((cfg.train.seed * 1_000_003 + step) * 1_009 + micro) * 65_537 + rank)
    rows = cfg.data.micro_batch_size * cfg.data.seq_len // r.copy_warmup_seq_len
    tokens, _, _ = repeat_batch(gen, rows, r.copy_warmup_seq_len, r.copy_warmup_draw, r.copy_warmup_max_passage)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}


class CopyWarmup(WrappedSource):
    """`inner` after `research.copy_warmup_steps` steps of copy-warmup batches. Stateless: the
    step says which batch to serve, so the checkpoints hold `inner`'s position only."""

    def __init__(self, inner: BatchSource, cfg, rank: int):
        super().__init__(inner)
        self.cfg, self.rank = cfg, rank

    def warming(self, step: int) -> bool:
        return step < self.cfg.research.copy_warmup_steps

    def next_batch(self, step: int, micro: int) -> Batch:
        if self.warming(step):
            return copy_warmup_batch(self.cfg, step, micro, self.rank)
        return self.inner.next_batch(step, micro)

    def record(self, step: int) -> dict[str, Any]:
        return {**self.inner.record(step), "copy_warmup": int(self.warming(step))}
