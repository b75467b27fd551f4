"""The held-out windows that validation (`train.eval_every`) reads: one set per stream of the
training mixture, weighted as training draws from the streams (`fsframework/data/mixture.py`).

Every stream's held-out split (`<source>/eval`) gives the same number of windows, the first
`train.eval_batches` micro-batches of its held-out text (the same windows at every evaluation).
The validation loss is the mean of the streams' losses weighted as the mixture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fsframework.config import Config
from fsframework.data.mixture import heldout_streams
from fsframework.eval.perplexity import heldout_tokens


@dataclass
class ValidationSet:
    label: str  # the stream's name in the metrics: `val/loss/<label>`
    weight: float  # its share of `val/loss`, the weights summing to 1
    windows: torch.Tensor  # [count, data.seq_len + 1] token ids


def validation_sets(cfg: Config) -> list[ValidationSet]:
    """The held-out windows of every stream; ValueError naming a stream whose split holds none."""
    length, rows = cfg.data.seq_len, cfg.train.eval_batches * cfg.data.micro_batch_size
    sets = []
    for held_out in heldout_streams(cfg, build=False):
        stream = torch.from_numpy(heldout_tokens(held_out.location, rows * (length + 1)))
        count = min(rows, len(stream) // (length + 1))
        if count == 0:
            raise ValueError(f"train.eval_every: the held-out split {held_out.location} has no window of "
                             f"data.seq_len + 1 = {length + 1} tokens")
        sets.append(ValidationSet(held_out.label, held_out.weight, stream[:count * (length + 1)].view(count, length + 1)))
    return sets
