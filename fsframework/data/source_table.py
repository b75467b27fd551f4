"""Which batch source a run trains on, from its config alone (`fsframework.data.sources`).

A run's source is the base source that `data.source` names (`SOURCES`; what each reads is in
`fsframework.config.sources`), wrapped by each wrapper of `WRAPPERS` in order (the last wrapper
serves first: the induction warm-up comes before the short sequences); a wrapper its config
leaves off returns None. A new source or wrapper is a row: `register_source` / `register_wrapper`
(a test's injected fault, an experiment's batches). The trainer asks `source_streams` for the
text it reads and `build_source` for its batches, and names no source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fsframework.config.data import skips_boundary_targets
from fsframework.config.sources import SourceFacts, declare_source, reads_text
from fsframework.data.copy_warmup import CopyWarmup
from fsframework.data.loader import TokenLoader, data_streams, make_streaming_dataset
from fsframework.data.mqar import RecallTaskLoader
from fsframework.data.sources import BatchSource, ShortSequences
from fsframework.data.warmups import InductionWarmup

Builder = Callable[..., BatchSource]  # (cfg, ctx) -> the base source
Wrapper = Callable[..., "BatchSource | None"]  # (cfg, source, ctx) -> the wrapped source, None: off


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
    return RecallTaskLoader(cfg.data.mqar, cfg.data.micro_batch_size, cfg.data.seq_len, cfg.data.shuffle_seed,
                            ctx.dp_rank)


def _text_source(cfg, ctx: SourceContext) -> BatchSource:
    dataset = make_streaming_dataset(ctx.streams, batch_size=cfg.data.micro_batch_size, shuffle=cfg.data.shuffle,
                                     seed=cfg.data.shuffle_seed, replication=cfg.parallel.sp,
                                     local_cache=str(ctx.data_cache))
    return TokenLoader(dataset, cfg.data.micro_batch_size, cfg.data.num_workers,
                       recall=cfg.loss if cfg.loss.recall_weighting else None,
                       locations=[location for location, _ in ctx.streams],
                       skip_boundary_targets=skips_boundary_targets(cfg.data))


def _short_sequences(cfg, source: BatchSource, ctx: SourceContext) -> BatchSource | None:
    t = cfg.train
    return ShortSequences(source, t.short_seq_len, t.short_seq_steps) if t.short_seq_steps else None


def _copy_warmup(cfg, source: BatchSource, ctx: SourceContext) -> BatchSource | None:
    return CopyWarmup(source, cfg, ctx.rank) if cfg.research.copy_warmup_steps else None


def _induction_warmup(cfg, source: BatchSource, ctx: SourceContext) -> BatchSource | None:
    return InductionWarmup(source, cfg, ctx.rank) if cfg.data.warmup.steps else None


# data.source -> the base source; the embedded corpus and shards at data.path are both text shards
# (`fsframework.data.loader.data_streams` finds them), a mixture in data.streams too
SOURCES: dict[str, Builder] = {"embedded": _text_source, "shards": _text_source, "mqar": _recall_source}

# name -> wrapper, applied in this order (the last one wraps outermost)
WRAPPERS: dict[str, Wrapper] = {"short_sequences": _short_sequences, "copy_warmup": _copy_warmup,
                                "induction_warmup": _induction_warmup}


def register_source(name: str, builder: Builder, facts: SourceFacts = SourceFacts(text=False)) -> None:
    """Make `data.source=name` build its base source with `builder(cfg, ctx)`; `facts` tell config
    validation what it reads (default: nothing, its rows are generated)."""
    declare_source(name, facts)
    SOURCES[name] = builder


def register_wrapper(name: str, wrapper: Wrapper) -> None:
    """Wrap every run's source with `wrapper(cfg, source, ctx)` (None: leave it as it is), outermost
    of the wrappers registered so far."""
    WRAPPERS.pop(name, None)
    WRAPPERS[name] = wrapper


def source_streams(cfg, *, build: bool) -> list:
    """The `(location, weight)` text streams the run's source reads ([] for generated rows); with
    `build`, the embedded corpus is built first if missing (on one rank, before the others read)."""

    return data_streams(cfg, "train", build=build) if reads_text(cfg) else []


def build_source(cfg, ctx: SourceContext) -> BatchSource:
    """The batch source of a run of config `cfg`."""
    source = SOURCES[cfg.data.source](cfg, ctx)
    for wrap in WRAPPERS.values():
        source = wrap(cfg, source, ctx) or source
    return source
