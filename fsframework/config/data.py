"""The data settings (`data.*`): the source or mixture, tokenizer, windows and batches, the embedded
corpus and the generated associative-recall source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

from fsframework.config.checks import ConfigError, positive, positive_fields
from fsframework.config.sources import check_source

if TYPE_CHECKING:
    from fsframework.config.job import Config


@dataclass
class StreamConfig:
    """One dataset of a mixture: an MDS directory at `path` (local or s3://... prefix) with
    `train/` and `eval/` splits, drawn with `proportion` (None: by size)."""

    path: str = ""
    proportion: Optional[float] = None


@dataclass
class MqarConfig:
    """Multi-query associative recall, generated on the fly (`data.source=mqar`, docs/evaluation.md §4.6):
    `pairs` key-value pairs of token ids spread over the context, filler between them, then
    `queries` of the keys each followed by its value. Ids: keys `[0, keys)`, values
    `[keys, keys + values)`, filler `[keys + values, keys + values + filler)`."""

    pairs: int = 8
    queries: int = 8  # at most `pairs`: each query asks a different pair
    keys: int = 64
    values: int = 64
    filler: int = 16


@dataclass
class WarmupConfig:
    """The induction warm-up (`data.warmup.*`, `fsframework.data.warmups`): the first `steps`
    optimizer steps train on rows that each tile one passage of random ids (`min_passage` ..
    `max_passage` long, drawn per row; ids `0 .. draw-1`, 0: the whole vocabulary) to the row's
    end, the loss on the tokens the repetition predicts only; then the run's source takes over.
    The varied lengths make a positional copy useless, so the model must find the current token's
    earlier occurrence and read what followed it: an induction head, which associative recall
    needs and which a small model rarely finds from recall rows alone."""

    steps: int = 0
    min_passage: int = 4
    max_passage: int = 64
    draw: int = 0


@dataclass
class DataConfig:
    # the batch source (fsframework.config.sources): embedded (built-in corpus), shards (MDS
    # shards at `path`), mqar (associative recall)
    source: str = "embedded"
    path: str = ""  # the data of a source that reads a path: a local MDS directory or an s3:// prefix
    streams: List[StreamConfig] = field(default_factory=list)  # a mixture; when set, it replaces the source
    cache_dir: str = "data_cache/embedded"  # the embedded corpus: one directory per build settings under it
    tokenizer: str = "byte"  # byte | path to tokenizer.json | path to sentencepiece .model
    seq_len: int = 512
    micro_batch_size: int = 4
    num_workers: int = 0
    shuffle: bool = True
    shuffle_seed: int = 1234
    embedded_python_chars: int = 3_000_000  # natural text taken from the stdlib sources
    embedded_retrieval_docs: int = 2000  # generated long-range retrieval documents
    # longest retrieval document in characters, as a fraction of seq_len (shortest: half of it);
    # below 1 most documents fit whole in one training window, needle and question together
    embedded_retrieval_max_fraction: float = 1.5
    eval_fraction: float = 0.02  # held out for perplexity
    # packed documents read apart (docs/training.md, "Documents"): attention, FreeSolo's routing and
    # window, AR-GRC's scan and positions restart at every document of a packed row
    document_masking: bool = False
    # the target that crosses into the next document (predicting a document's first token from the
    # end of another) is not scored; None: as document_masking
    skip_boundary_targets: Optional[bool] = None
    mqar: MqarConfig = field(default_factory=MqarConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)


def check_data(cfg: Config) -> None:
    """`cfg.data`, and how its source fits the model, the loss and validation."""
    d = cfg.data
    positive_fields("data", d, ("seq_len", "micro_batch_size", "embedded_retrieval_max_fraction"))
    positive("data.num_workers", d.num_workers, zero_ok=True)
    for i, stream in enumerate(d.streams):
        if not stream.path:
            raise ConfigError(f"data.streams[{i}].path is empty: give a local directory or an s3:// prefix")
        if stream.proportion is not None and stream.proportion <= 0:
            raise ConfigError(f"data.streams[{i}].proportion={stream.proportion} must be > 0")
    if not 0.0 <= d.eval_fraction < 1.0:
        raise ConfigError(f"data.eval_fraction={d.eval_fraction} must lie in [0, 1)")
    _check_mqar(cfg)
    check_source(cfg)
    _check_warmup(cfg)


def skips_boundary_targets(data) -> bool:
    """Whether the target that crosses into the next packed document goes unscored."""
    return data.document_masking if data.skip_boundary_targets is None else data.skip_boundary_targets


def _check_warmup(cfg: Config) -> None:
    """The induction warm-up: a passage and at least one repetition fit a row, ids in the vocabulary."""
    w = cfg.data.warmup
    positive("data.warmup.steps", w.steps, zero_ok=True)
    positive("data.warmup.draw", w.draw, zero_ok=True)
    if not w.steps:
        return
    if not 2 <= w.min_passage <= w.max_passage:
        raise ConfigError(f"data.warmup.min_passage={w.min_passage} and max_passage={w.max_passage} must satisfy "
                          "2 <= min_passage <= max_passage")
    if 2 * w.max_passage > cfg.data.seq_len + 1:
        raise ConfigError(f"data.warmup.max_passage={w.max_passage} is more than half of data.seq_len="
                          f"{cfg.data.seq_len}: a passage must repeat at least once in a row")
    if w.draw > cfg.model.vocab_size:
        raise ConfigError(f"data.warmup.draw={w.draw} exceeds model.vocab_size={cfg.model.vocab_size}")


def _check_mqar(cfg: Config) -> None:
    """The associative-recall settings (docs/evaluation.md §4.6); how they fit a run on the source is
    the source's own check (`fsframework.config.sources`)."""
    m = cfg.data.mqar
    positive_fields("data.mqar", m, ("pairs", "queries", "keys", "values", "filler"))
    if m.queries > m.pairs:
        raise ConfigError(f"data.mqar.queries={m.queries} exceeds data.mqar.pairs={m.pairs}: each query asks a "
                          "different pair")
    if m.pairs > m.keys:
        raise ConfigError(f"data.mqar.pairs={m.pairs} exceeds data.mqar.keys={m.keys}: the keys of one sequence "
                          "are distinct")
