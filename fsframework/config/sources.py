"""The facts of each batch source that `data.source` names, for config validation (no torch).

`SOURCE_FACTS` says which sources exist and what each reads: a path (`data.path`), tokenized
text shards (so a held-out split, a tokenizer that must fit, a mixture in `data.streams`), or
nothing but generated rows. The builders that turn a source into batches live in
`fsframework.data.source_table`; its `register_source` declares a new source's facts here too,
so validation knows every source the run can build.

    embedded  the built-in corpus, built on first use under `data.cache_dir` (the default)
    shards    mosaicml-streaming shards at `data.path` (local directory or `s3://...`)
    mqar      multi-query associative recall rows, generated (docs/evaluation.md §4.6)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from fsframework.config.checks import ConfigError

if TYPE_CHECKING:
    from fsframework.config.job import Config


@dataclass(frozen=True)
class SourceFacts:
    """What a source reads. `needs_path`: `data.path` names its data (and must be set); `text`: it
    reads tokenized MDS text shards (held-out split, tokenizer check, `data.streams` may replace it
    with a mixture); `check`: the source's own checks of the whole config, if any."""

    needs_path: bool = False
    text: bool = True
    check: Optional[Callable[["Config"], None]] = None


def _check_recall_run(cfg: Config) -> None:
    """A run on generated recall rows (docs/evaluation.md §4.6): ids within the vocabulary, room for
    the pairs, and no option that reads text."""
    m = cfg.data.mqar
    ids = m.keys + m.values + m.filler
    if ids > cfg.model.vocab_size:
        raise ConfigError(f"data.mqar uses {ids} token ids (keys + values + filler), more than "
                          f"model.vocab_size={cfg.model.vocab_size}")
    if 2 * (m.pairs + m.queries) > cfg.data.seq_len:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} cannot hold data.mqar's {m.pairs} pairs and "
                          f"{m.queries} queries (2 tokens each)")
    if cfg.loss.recall_weighting:
        raise ConfigError("loss.recall_weighting does not apply to data.source=mqar (its loss is on the "
                          "queried values only): set loss.recall_weighting=false")
    if cfg.train.eval_every:
        raise ConfigError("train.eval_every reads the held-out text split, which data.source=mqar has not: "
                          "set train.eval_every=0 and score recall with `fsf eval RUN --tasks mqar`")


SOURCE_FACTS: dict[str, SourceFacts] = {
    "embedded": SourceFacts(),
    "shards": SourceFacts(needs_path=True),
    "mqar": SourceFacts(text=False, check=_check_recall_run),
}


# the source names `data.source` had in schema 4, when any other value was a path to shards
# (`fsframework.config.schema` rewrites those): a fixed list, since a source declared later
# was never a schema-4 value
SCHEMA4_SOURCE_NAMES = ("embedded", "mqar")


def is_schema4_source_name(value: str) -> bool:
    """Whether a schema-4 `data.source` value named a source rather than the path of shards."""
    return value in SCHEMA4_SOURCE_NAMES


def declare_source(name: str, facts: SourceFacts) -> None:
    """Make `name` a valid `data.source` with `facts` (`fsframework.data.source_table.register_source`)."""
    SOURCE_FACTS[name] = facts


def reads_text(cfg: Config) -> bool:
    """Whether the run reads tokenized text shards: a mixture, or a text source."""
    return bool(cfg.data.streams) or SOURCE_FACTS[cfg.data.source].text


def data_path(cfg: Config) -> str:
    """The path the run's source reads (`data.path`), "" for a source that reads none."""
    return cfg.data.path if SOURCE_FACTS[cfg.data.source].needs_path else ""


def _looks_like_path(value: str) -> bool:
    return any(mark in value for mark in ("/", "\\", "://")) or value.startswith(".") or Path(value).exists()


def check_source(cfg: Config) -> None:
    """`data.source` names a known source, `data.path` is set where the source reads one (a source
    that reads none ignores it: a job's shards switched to `data.source=embedded` by an override
    keeps working), a mixture only replaces a text source; then the source's own checks. One line each."""
    d = cfg.data
    facts = SOURCE_FACTS.get(d.source)
    if facts is None:
        if _looks_like_path(d.source):
            raise ConfigError(f"data.source={d.source!r} is a path: data.source names a source, write "
                              f"data.source=shards data.path={d.source}")
        raise ConfigError(f"data.source={d.source!r} is not a source; choose one of {', '.join(SOURCE_FACTS)}")
    if facts.needs_path and not d.path and not d.streams:
        raise ConfigError(f"data.source={d.source} reads the data at data.path, which is not set: "
                          f"write data.path=DIR (an MDS directory or s3:// prefix)")
    if d.streams and not facts.text:
        raise ConfigError(f"data.source={d.source} generates its data: remove data.streams")
    if facts.check is not None:
        facts.check(cfg)
