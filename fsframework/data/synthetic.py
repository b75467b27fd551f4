"""Synthetic token batches: repeated passages of random tokens, the purest copying signal.

A passage of uniformly random tokens followed by itself again is what makes induction
(copying) heads form: the first copy is unpredictable, every token of the second copy
but its first is predictable ONLY by finding the earlier occurrence of the current
token and reading what followed it. The copy warmup (`research.copy_warmup_*`,
`fsframework.data.copy_warmup`) trains on these batches before the data stream starts, and
copy probes measure the loss on their two copies.

Legend: B batch, T time.
"""

from __future__ import annotations

import torch


def repeat_batch(gen: torch.Generator, batch: int, seq_len: int, draw: int, max_passage: int,
                 min_passage: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`batch` rows of `seq_len + 1` tokens: passages of `min_passage..max_passage` (default a
    quarter of the maximum) random tokens from `0..draw-1`, each followed by itself, packed
    and cut at the row end.

    Returns `tokens [B, T+1]` and two boolean masks over the targets `tokens[:, 1:]` `[B, T]`:
    `first` marks tokens of first copies (unpredictable), `second` the tokens of second copies
    that copying predicts (all but a copy's first token, whose predecessor is the end of the
    first copy)."""
    tokens, first, second, _ = repeat_batch_with_sources(gen, batch, seq_len, draw, max_passage, min_passage)
    return tokens, first, second


def repeat_batch_with_sources(gen: torch.Generator, batch: int, seq_len: int, draw: int, max_passage: int,
                              min_passage: int | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`repeat_batch` (the same rows for the same generator state) plus `source [B, T]`: for each
    target of `second`, the input position (into `tokens[:, :-1]`) of the token it copies, the
    key an induction head must read; -1 elsewhere. A passage of n tokens puts it n - 1 back."""
    low = max(2, min_passage or max_passage // 4)
    if not 2 <= low <= max_passage:
        raise ValueError(f"passage lengths {low}..{max_passage} must be at least 2")
    rows, firsts, seconds, sources = [], [], [], []
    for _ in range(batch):
        tokens: list[int] = []
        first: list[bool] = []
        second: list[bool] = []
        source: list[int] = []  # by token position p: where the token of p was drawn
        while len(tokens) < seq_len + 1:
            n = int(torch.randint(low, max_passage + 1, (), generator=gen))
            passage = torch.randint(0, draw, (n,), generator=gen).tolist()
            start = len(tokens)
            tokens += passage + passage
            first += [True] * n + [False] * n
            second += [False] * (n + 1) + [True] * (n - 1)
            source += [-1] * (n + 1) + list(range(start + 1, start + n))
        rows.append(tokens[:seq_len + 1])
        # masks are indexed by target position: target i is token i + 1
        firsts.append(first[1:seq_len + 1])
        seconds.append(second[1:seq_len + 1])
        sources.append(source[1:seq_len + 1])
    return torch.tensor(rows), torch.tensor(firsts), torch.tensor(seconds), torch.tensor(sources)
