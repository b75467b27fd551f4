"""The held-out windows that validation (`train.eval_every`) reads: one set per stream of the
training mixture, weighted as training draws from the streams (`fsframework/data/mixture.py`).

Every stream's held-out split (`<source>/eval`) gives the same number of windows, the first
`train.eval_batches` micro-batches of its held-out text (the same windows at every evaluation).
The validation loss is the mean of the streams' losses weighted as the mixture.

With `data.document_masking` the windows are the held-out samples as stored, with their document
ids, so validation reads the documents apart as training does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fsframework.config import Config
from fsframework.config.data import skips_boundary_targets
from fsframework.data.loader import window_batch
from fsframework.data.mixture import heldout_streams
from fsframework.eval.perplexity import heldout_samples, heldout_tokens


@dataclass
class ValidationSet:
    label: str  # the stream's name in the metrics: `val/loss/<label>`
    weight: float  # its share of `val/loss`, the weights summing to 1
    windows: torch.Tensor  # [count, data.seq_len + 1] token ids
    doc_ids: Optional[torch.Tensor] = None  # their document ids (document masking), else None
    skip_boundary_targets: bool = False

    def batch(self, start: int, size: int) -> dict[str, torch.Tensor]:
        """Windows `[start, start + size)` as a batch: inputs, targets and the inputs' doc_ids (None
        without document masking)."""
        windows = self.windows[start:start + size]
        if self.doc_ids is None:
            return {"inputs": windows[:, :-1], "targets": windows[:, 1:], "doc_ids": None}
        return window_batch(windows.numpy(), self.doc_ids[start:start + size].numpy(),
                            skip_boundary_targets=self.skip_boundary_targets)


def validation_sets(cfg: Config) -> list[ValidationSet]:
    """The held-out windows of every stream; ValueError naming a stream whose split holds none."""
    length, rows = cfg.data.seq_len, cfg.train.eval_batches * cfg.data.micro_batch_size
    sets = []
    for held_out in heldout_streams(cfg, build=False):
        if cfg.data.document_masking:
            tokens, doc_ids = heldout_samples(held_out.location, rows)
            if tokens.shape[0] == 0:
                raise ValueError(f"train.eval_every: the held-out split {held_out.location} has no sample")
            sets.append(ValidationSet(held_out.label, held_out.weight, torch.from_numpy(tokens),
                                      torch.from_numpy(doc_ids), skips_boundary_targets(cfg.data)))
            continue
        stream = torch.from_numpy(heldout_tokens(held_out.location, rows * (length + 1)))
        count = min(rows, len(stream) // (length + 1))
        if count == 0:
            raise ValueError(f"train.eval_every: the held-out split {held_out.location} has no window of "
                             f"data.seq_len + 1 = {length + 1} tokens")
        sets.append(ValidationSet(held_out.label, held_out.weight, stream[:count * (length + 1)].view(count, length + 1)))
    return sets
