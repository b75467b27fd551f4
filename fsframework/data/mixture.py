"""The held-out splits of a run's data and their weights: one per stream of the training mixture
(`data.streams`), or the one dataset. Validation (`train/validation.py`), `fsf eval`'s perplexity
and `fsf calibrate` read them alike.

A stream's weight is its share of the training mixture: `data.streams[i].proportion`, or, where
the proportions are left to the data (None), the size of its training split, as
mosaicml-streaming mixes them (equal weights when a split's size cannot be read here: a remote
stream). One dataset is one stream of weight 1, labelled "data".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fsframework.config import Config
from fsframework.data.inspect_shards import read_index
from fsframework.data.loader import data_streams


@dataclass(frozen=True)
class HeldOutStream:
    label: str  # the stream's short name: its directory's name (numbered when two share one)
    weight: float  # its share of the mixture, the weights summing to 1
    location: str  # its held-out MDS split (`<path>/eval`)


def heldout_streams(cfg: Config, *, build: bool = True) -> list[HeldOutStream]:
    """Every stream's held-out split; FileNotFoundError naming a stream that has none (`build`:
    build the embedded corpus when it is the source and not built yet)."""

    locations = [location for location, _ in data_streams(cfg, "eval", build=build)]
    return [HeldOutStream(label, weight, location)
            for label, weight, location in zip(stream_labels(cfg), mixture_weights(cfg), locations)]


def stream_labels(cfg: Config) -> list[str]:
    """A short name per stream (its directory's name; numbered when two share one), as a tag."""
    if not cfg.data.streams:
        return ["data"]
    names = [re.sub(r"[^\w.-]", "_", Path(s.path.rstrip("/")).name) or "stream" for s in cfg.data.streams]
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
        sizes = [_training_samples(location) for location, _ in data_streams(cfg, "train", build=False)]
        raw = [float(size) for size in sizes] if all(sizes) else [1.0] * len(streams)
    return [w / sum(raw) for w in raw]


def _training_samples(location: str) -> int:
    """Samples in a training split (0 when it cannot be read here: a remote one)."""

    if "://" in location:
        return 0
    return sum(int(shard.get("samples", 0)) for shard in read_index(Path(location)))
