"""Which batch source a run trains on, from its config alone (`fsframework.data.sources`).

A run's source is a base source chosen by `data.source` (`BASE_SOURCES`: a generated task by
name, anything else text shards), wrapped by each configured warm-up in `WRAPPERS` order (the
last wrapper serves first: the induction warm-up comes before the short sequences). A new source
or warm-up is a row here; the training loop only asks the built source for batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fsframework.data.sources import BatchSource


@dataclass
class SourceContext:
    """What a source needs besides the config: the text streams (`(location, weight)` pairs), the
    data-parallel rank (the ranks of one SP group read the same rows), the global rank (generated
    warm-up batches differ per rank) and where streaming caches its shards."""

    streams: list
    dp_rank: int
    rank: int
    data_cache: Path


def _recall_source(cfg, ctx: SourceContext) -> BatchSource:
    from fsframework.data.mqar import RecallTaskLoader

    return RecallTaskLoader(cfg.data.mqar, cfg.data.micro_batch_size, cfg.data.seq_len, cfg.data.shuffle_seed,
                            ctx.dp_rank)


def _text_source(cfg, ctx: SourceContext) -> BatchSource:
    from fsframework.data.loader import TokenLoader, make_streaming_dataset

    dataset = make_streaming_dataset(ctx.streams, batch_size=cfg.data.micro_batch_size, shuffle=cfg.data.shuffle,
                                     seed=cfg.data.shuffle_seed, replication=cfg.parallel.sp,
                                     local_cache=str(ctx.data_cache))
    return TokenLoader(dataset, cfg.data.micro_batch_size, cfg.data.num_workers,
                       recall=cfg.loss if cfg.loss.recall_weighting else None,
                       locations=[location for location, _ in ctx.streams])


def _short_sequences(cfg, source: BatchSource, ctx: SourceContext) -> BatchSource | None:
    from fsframework.data.sources import ShortSequences

    t = cfg.train
    return ShortSequences(source, t.short_seq_len, t.short_seq_steps) if t.short_seq_steps else None


def _copy_warmup(cfg, source: BatchSource, ctx: SourceContext) -> BatchSource | None:
    from fsframework.data.copy_warmup import CopyWarmup

    return CopyWarmup(source, cfg, ctx.rank) if cfg.research.copy_warmup_steps else None


def _induction_warmup(cfg, source: BatchSource, ctx: SourceContext) -> BatchSource | None:
    from fsframework.data.warmups import InductionWarmup

    return InductionWarmup(source, cfg, ctx.rank) if cfg.data.warmup.steps else None


# data.source -> the base source; a source not named here is a path or the embedded corpus (text shards)
BASE_SOURCES: dict[str, Callable[..., BatchSource]] = {"mqar": _recall_source}

# each returns the wrapped source, or None when its warm-up is off
WRAPPERS: tuple[Callable[..., BatchSource | None], ...] = (_short_sequences, _copy_warmup, _induction_warmup)


def build_source(cfg, ctx: SourceContext) -> BatchSource:
    """The batch source of a run of config `cfg`."""
    source = BASE_SOURCES.get(cfg.data.source, _text_source)(cfg, ctx)
    for wrap in WRAPPERS:
        source = wrap(cfg, source, ctx) or source
    return source
