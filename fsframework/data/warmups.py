"""The induction warm-up (`data.warmup.*`, experiments/README.md "What forms association").

A row tiles one passage of random ids to its end:

    a b c d e a b c d e a b c d e a ...      (passage of n = 5, drawn per row)

Every token from the second copy on is predictable, and only by finding the current token's
previous occurrence and reading what followed it: the induction circuit that associative recall
needs (a recall query is a key whose earlier occurrence is followed by the answer). The loss is on
those tokens only (the first copy is noise; training on it teaches unigram guessing). The passage
length is drawn per row, from `min_passage` to `max_passage`: with one fixed length a model learns
to copy from a fixed distance back (a positional copy), which does not transfer to recall.

Legend: B rows, T targets per row (a row holds T + 1 tokens).
"""

from __future__ import annotations

from typing import Any

import torch

from fsframework.data.sources import Batch, BatchSource, WrappedSource


def induction_rows(gen: torch.Generator, batch: int, targets: int, draw: int, min_passage: int,
                   max_passage: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`tokens [B, T + 1]` (each row one passage of `min_passage..max_passage` ids from `0..draw-1`,
    tiled) and `predictable [B, T]` over the targets `tokens[:, 1:]`: True where the target lies in
    a repetition (token position >= the row's passage length)."""
    lengths = torch.randint(min_passage, max_passage + 1, (batch, 1), generator=gen)
    passages = torch.randint(0, draw, (batch, max_passage), generator=gen)
    positions = torch.arange(targets + 1).unsqueeze(0)
    tokens = torch.gather(passages, 1, positions % lengths)
    predictable = positions[:, 1:] >= lengths  # target i is token i + 1
    return tokens, predictable


def induction_batch(warmup, vocab_size: int, rows: int, targets: int, seed: int, step: int, micro: int,
                    rank: int) -> Batch:
    """One micro-batch of the warm-up `warmup` (a `WarmupConfig`): `{"inputs", "targets"}` `[rows,
    targets]`, unpredictable targets -100 (not scored). Drawn from a generator seeded by (seed,
    step, micro-batch, rank): a resumed run sees the same batches, ranks see different ones."""
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_009 + micro) * 65_537 + rank)
    tokens, predictable = induction_rows(gen, rows, targets, warmup.draw or vocab_size, warmup.min_passage,
                                         warmup.max_passage)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:].masked_fill(~predictable, -100)}


class InductionWarmup(WrappedSource):
    """`inner` after `data.warmup.steps` steps of induction batches of the run's own shape (micro
    batch x seq_len). Stateless: the step says which batch to serve, so the checkpoints hold
    `inner`'s position only, and `inner` is not read during the warm-up. The metrics line of a
    warm-up step says `warmup: 1` and names its loss `warmup/copy_loss` too (the loss on the
    predictable tokens)."""

    def __init__(self, inner: BatchSource, cfg, rank: int):
        super().__init__(inner)
        self.cfg, self.rank = cfg, rank

    def warming(self, step: int) -> bool:
        return step < self.cfg.data.warmup.steps

    def next_batch(self, step: int, micro: int) -> Batch:
        if not self.warming(step):
            return self.inner.next_batch(step, micro)
        cfg = self.cfg
        return induction_batch(cfg.data.warmup, cfg.model.vocab_size, cfg.data.micro_batch_size, cfg.data.seq_len,
                               cfg.train.seed, step, micro, self.rank)

    def record(self, step: int) -> dict[str, Any]:
        if self.warming(step):
            return {**self.inner.record(step), "warmup": 1, "loss_alias": "warmup/copy_loss"}
        return {**self.inner.record(step), "warmup": 0}
