"""Multi-query associative recall (MQAR), generated on the fly (docs/evaluation.md §4.6).

A row holds `pairs` key-value pairs (two tokens each: a key id, then its value id) at
random places in a context of filler tokens, then `queries` of the keys again, each
followed by its value:

    f f k3 v3 f f f k1 v1 f ... f k7 v7 f f | k1 v1 k7 v7 ...
    <------------------ context ----------> <-- queries -->

Only a queried value is scored (loss weight 1, every other target 0): predicting it needs the
value that followed the same key in the context, which lies anywhere before, so a model
answers a pair further back than its stacked local windows only through whatever reads the
whole prefix (FreeSolo's routed cells, full attention). Keys of one row are distinct, values
are drawn independently, and the queried pairs are a random subset in random order.

Rows depend on a `torch.Generator` only: the same seed gives the same rows at every length,
and a training run's batch `i` on rank `r` is drawn from a generator seeded by
`(seed, i, r)`, so resume is exact without saving the data.

Legend: B batch, T targets per row (a row holds `T + 1` tokens), P pairs, Q queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fsframework.data.sources import StreamSource


@dataclass
class RecallRows:
    """`tokens [B, T + 1]`; over the targets `tokens[:, 1:]` `[B, T]`: `weights` (1.0 at the
    queried values, else 0), `source` (for a queried value, the input position of the value
    that answers it in the context; -1 elsewhere); `values [B, P]`: the values of each row's
    context pairs (an id may repeat: values are drawn independently)."""

    tokens: torch.Tensor
    weights: torch.Tensor
    source: torch.Tensor
    values: torch.Tensor

    def distance(self) -> torch.Tensor:
        """`[B, T]`: how far back the answer lies from the query's input position (-1 where unscored)."""
        positions = torch.arange(self.source.shape[1])
        return torch.where(self.source >= 0, positions - self.source, torch.full_like(self.source, -1))


def recall_rows(gen: torch.Generator, spec, batch: int, targets: int) -> RecallRows:
    """`batch` rows of `targets + 1` tokens under `spec` (a `MqarConfig`: pairs, queries and the
    sizes of the key, value and filler id ranges)."""
    pairs, queries = spec.pairs, spec.queries
    context = targets + 1 - 2 * queries
    slots = context // 2  # pairs start at even positions of the context, never overlapping
    if pairs > slots or queries > pairs or pairs > spec.keys:
        raise ValueError(f"{targets + 1} tokens cannot hold {pairs} pairs and {queries} queries with "
                         f"{spec.keys} keys")
    first_value, first_filler = spec.keys, spec.keys + spec.values
    tokens = torch.randint(first_filler, first_filler + spec.filler, (batch, targets + 1), generator=gen)
    weights = torch.zeros(batch, targets)
    source = torch.full((batch, targets), -1, dtype=torch.long)
    row_values = torch.empty(batch, pairs, dtype=torch.long)
    for row in range(batch):
        starts = 2 * torch.randperm(slots, generator=gen)[:pairs]
        keys = torch.randperm(spec.keys, generator=gen)[:pairs]
        values = torch.randint(first_value, first_value + spec.values, (pairs,), generator=gen)
        tokens[row, starts] = keys
        tokens[row, starts + 1] = values
        asked = torch.randperm(pairs, generator=gen)[:queries]
        key_at = context + 2 * torch.arange(queries)  # the queries' key positions
        tokens[row, key_at] = keys[asked]
        tokens[row, key_at + 1] = values[asked]
        weights[row, key_at] = 1.0  # target index i predicts token i + 1: the value after the key at i
        source[row, key_at] = starts[asked] + 1
        row_values[row] = values
    return RecallRows(tokens, weights, source, row_values)


class RecallTaskLoader(StreamSource):
    """The training loop's batch source for `data.source=mqar` (`fsframework.data.sources`): endless batches `{"inputs", "targets",
    "weights"}` `[B, T]`, batch `i` of rank `rank` drawn from a generator seeded by
    `(seed, i, rank)`. State: the number of batches handed out."""

    def __init__(self, spec, batch_size: int, seq_len: int, seed: int, rank: int):
        self.spec, self.batch_size, self.seq_len, self.seed, self.rank = spec, batch_size, seq_len, seed, rank
        self.batches = 0

    def __iter__(self) -> "RecallTaskLoader":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + self.batches) * 65_537 + self.rank)
        rows = recall_rows(gen, self.spec, self.batch_size, self.seq_len)
        self.batches += 1
        return {"inputs": rows.tokens[:, :-1], "targets": rows.tokens[:, 1:], "weights": rows.weights}

    def state_dict(self) -> dict[str, Any]:
        return {"mqar_batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "mqar_batches" not in state:
            raise ValueError("the checkpoint's data state is not from a data.source=mqar run")
        self.batches = int(state["mqar_batches"])
