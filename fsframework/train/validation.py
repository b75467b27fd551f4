"""The held-out windows that validation (`train.eval_every`) reads: one set per stream of the
training mixture, weighted as training draws from the streams.

Every stream's held-out split (`<source>/eval`) gives the same number of windows, the first
`train.eval_batches` micro-batches of its held-out text (the same windows at every evaluation).
The validation loss is the mean of the streams' losses weighted as the mixture: by
`data.streams[i].proportion`, or, where the proportions are left to the data (None), by the size
of each stream's training split, as mosaicml-streaming mixes them (equal weights when a split's
size cannot be read here: a remote stream). One dataset is one set of weight 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from fsframework.config import Config


@dataclass
class ValidationSet:
    label: str  # the stream's name in the metrics: `val/loss/<label>`
    weight: float  # its share of `val/loss`, the weights summing to 1
    windows: torch.Tensor  # [count, data.seq_len + 1] token ids


def validation_sets(cfg: Config) -> list[ValidationSet]:
    """The held-out windows of every stream; ValueError naming a stream whose split holds none."""
    from fsframework.data.loader import data_streams
    from fsframework.eval.perplexity import heldout_tokens

    length, rows = cfg.data.seq_len, cfg.train.eval_batches * cfg.data.micro_batch_size
    locations = [location for location, _ in data_streams(cfg, "eval", build=False)]
    labels = stream_labels(cfg)
    sets = []
    for label, weight, location in zip(labels, mixture_weights(cfg), locations):
        stream = torch.from_numpy(heldout_tokens(location, rows * (length + 1)))
        count = min(rows, len(stream) // (length + 1))
        if count == 0:
            raise ValueError(f"train.eval_every: the held-out split {location} has no window of data.seq_len + 1 = "
                             f"{length + 1} tokens")
        sets.append(ValidationSet(label, weight, stream[:count * (length + 1)].view(count, length + 1)))
    return sets


def stream_labels(cfg: Config) -> list[str]:
    """A short name per stream (its directory's name; numbered when two share one), as a tensorboard tag."""
    if not cfg.data.streams:
        return ["data"]
    names = [re.sub(r"[^\w.-]", "_", Path(s.source.rstrip("/")).name) or "stream" for s in cfg.data.streams]
    if len(set(names)) < len(names):
        names = [f"{i}-{name}" for i, name in enumerate(names)]
    return names


def mixture_weights(cfg: Config) -> list[float]:
    """Each stream's share of the training mixture (summing to 1)."""
    streams = cfg.data.streams
    if not streams:
        return [1.0]
    if all(s.proportion is not None for s in streams):
        raw = [float(s.proportion) for s in streams]
    else:
        from fsframework.data.loader import data_streams

        sizes = [_training_samples(location) for location, _ in data_streams(cfg, "train", build=False)]
        raw = [float(size) for size in sizes] if all(sizes) else [1.0] * len(streams)
    return [w / sum(raw) for w in raw]


def _training_samples(location: str) -> int:
    """Samples in a training split (0 when it cannot be read here: a remote one)."""
    from fsframework.data.inspect_shards import read_index

    if "://" in location:
        return 0
    return sum(int(shard.get("samples", 0)) for shard in read_index(Path(location)))
