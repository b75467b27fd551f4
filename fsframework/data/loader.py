"""Training data: MDS shards read back through mosaicml-streaming.

`data_streams` names the MDS datasets of `cfg.data` with their mixture proportions
(`prepare_data_dir` builds the embedded corpus on first use), `check_shard_files`
checks their files at start-up, `make_streaming_dataset` opens them as one
StreamingDataset, and `TokenLoader` yields batches forever, epoch after epoch, as
dicts of `[B, seq_len]` tensors (`inputs`, `targets`, `doc_ids`, and `weights` under
recall weighting, see `Collate`), with a `state_dict` that resumes exactly mid-epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from fsframework.config import Config, ConfigError
from fsframework.config.sources import data_path, reads_text
from fsframework.data.corpus import build_embedded_corpus, embedded_corpus_dir, embedded_recipe
from fsframework.data.inspect_shards import ShardError, read_index, read_shard
from fsframework.data.masks import loss_weights, recall_masks
from fsframework.data.sample_loader import SampleCountingLoader
from fsframework.data.sources import StreamSource
from fsframework.data.tokenizers import load_tokenizer, tokenizer_identity


def _split_location(source: str, split: str) -> str:
    """`<source>/<split>` for a local or remote dataset root (a bare MDS dir serves as train)."""
    root = source.rstrip("/")
    if "://" in root:
        return f"{root}/{split}"
    local = Path(root) / split
    if not Path(root).is_dir():
        raise FileNotFoundError(f"dataset {source!r}: {'is a file, not' if Path(root).exists() else 'not found; give'} "
                                "an MDS directory (build one with `fsf data build`)")
    if (local / "index.json").is_file():
        return str(local)
    if split == "train" and (Path(root) / "index.json").is_file():
        return root
    if split == "eval" and ((Path(root) / "index.json").is_file() or (Path(root) / "train" / "index.json").is_file()):
        # built with --eval-fraction 0, or too small for the default split (`fsf data build` said so)
        raise FileNotFoundError(f"dataset {source!r} has no held-out split ({local} is missing): rebuild it with "
                                f"`fsf data build ... --out {source} --overwrite`, which holds out 2% of the "
                                "documents (--eval-fraction F or --eval-docs N to choose; a corpus too small for it "
                                "needs more data)")
    raise FileNotFoundError(f"dataset {source!r}: no MDS index at {local / 'index.json'} "
                            "(build shards with `fsf data build`)")


def _dataset_roots(cfg: Config) -> list[str]:
    """The MDS datasets the run names: its mixture's, or the one at `data.path` (the embedded corpus,
    built here, is none)."""
    if cfg.data.streams:
        return [s.path for s in cfg.data.streams]
    return [data_path(cfg)] if data_path(cfg) else []


def check_data_fits(cfg: Config, heldout_for: str | None = None) -> None:
    """Checks before any work (no run directory, no engine): the tokenizer's vocabulary fits
    `model.vocab_size`, every local dataset exists and was built with `data.tokenizer` and
    `data.seq_len` (its `build.json`), and, when `heldout_for` names the option that reads it, every dataset's
    held-out split exists.
    Raises ConfigError or FileNotFoundError (both one line, naming the option to change)."""
    import json

    if not reads_text(cfg):
        return  # generated ids, checked against the vocabulary by the config
    try:
        tok = load_tokenizer(cfg.data.tokenizer)
    except ValueError as exc:  # a file that is no tokenizer
        raise ConfigError(f"data.tokenizer: {exc}") from None
    if tok.vocab_size > cfg.model.vocab_size:
        raise ConfigError(f"data.tokenizer={cfg.data.tokenizer} has {tok.vocab_size} tokens, more than "
                          f"model.vocab_size={cfg.model.vocab_size}: set model.vocab_size={tok.vocab_size} or more")
    mine = tokenizer_identity(tok)
    for source in _dataset_roots(cfg):
        recipe_file = Path(source) / "build.json"
        if "://" in source or not recipe_file.is_file():
            continue
        recipe = json.loads(recipe_file.read_text())["recipe"]
        if recipe.get("seq_len", cfg.data.seq_len) != cfg.data.seq_len:  # samples are trained as stored
            raise ConfigError(f"dataset {source} holds samples of {recipe['seq_len']} tokens (built with --seq-len "
                              f"{recipe['seq_len']}), not data.seq_len={cfg.data.seq_len}: set data.seq_len="
                              f"{recipe['seq_len']} or rebuild the dataset with --seq-len {cfg.data.seq_len}")
        built = recipe.get("tokenizer_identity")
        if built is not None and (built["vocab_size"], built["eos_id"], built["sha256"]) != (
                mine["vocab_size"], mine["eos_id"], mine["sha256"]):
            raise ConfigError(f"dataset {source} was built with tokenizer {built['name']} (vocabulary "
                              f"{built['vocab_size']}), not data.tokenizer={cfg.data.tokenizer} (vocabulary "
                              f"{mine['vocab_size']}): set data.tokenizer={built['name']} or rebuild the dataset")
    for source in _dataset_roots(cfg):
        _split_location(source, "train")
        if heldout_for:  # validation and perplexity read every stream's held-out split
            try:
                _split_location(source, "eval")
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"{heldout_for} reads the held-out split: {exc}") from None


def _embedded_settings(cfg: Config) -> dict:
    """The arguments of `build_embedded_corpus` and `embedded_recipe` from `cfg.data`."""
    data = cfg.data
    return {"tokenizer": load_tokenizer(data.tokenizer), "seq_len": data.seq_len,
            "python_chars": data.embedded_python_chars, "retrieval_docs": data.embedded_retrieval_docs,
            "eval_fraction": data.eval_fraction, "retrieval_max_fraction": data.embedded_retrieval_max_fraction,
            "seed": 0}


def embedded_corpus_location(cfg: Config) -> Path:
    """The directory of the embedded corpus of `cfg` (built or not): `data.cache_dir/seq<N>-<hash>`, keyed
    by everything the build depends on (`fsframework.data.corpus.embedded_recipe`). Training,
    validation, `fsf eval`, `fsf calibrate` and a resumed run all find the corpus through here."""
    return embedded_corpus_dir(cfg.data.cache_dir, embedded_recipe(**_embedded_settings(cfg)))


def derived_data_location(cfg: Config) -> str | None:
    """A line naming where the run's text lies when the config does not spell it out (the embedded
    corpus's keyed directory, training prints it), else None."""
    if reads_text(cfg) and not cfg.data.streams and not data_path(cfg):
        return f"embedded corpus: {embedded_corpus_location(cfg)}"
    return None


def prepare_data_dir(cfg: Config, split: str = "train", *, build: bool = True) -> str:
    """Location of the single MDS dataset for `split` (`train` or `eval`): the shards at `data.path`
    (data.source=shards), else the embedded corpus (`embedded_corpus_location`), built on first use."""
    if data_path(cfg):
        return _split_location(data_path(cfg), split)
    root = build_embedded_corpus(cfg.data.cache_dir, **_embedded_settings(cfg)) if build else \
        embedded_corpus_location(cfg)
    return str(root / split)


def data_streams(cfg: Config, split: str = "train", *, build: bool = True) -> list[tuple[str, float | None]]:
    """(location, proportion) of every stream of the configured mixture."""
    if not reads_text(cfg):
        raise FileNotFoundError(f"data.source={cfg.data.source} generates its rows: the run has no text "
                                "shards to read")
    if cfg.data.streams:
        return [(_split_location(s.path, split), s.proportion) for s in cfg.data.streams]
    return [(prepare_data_dir(cfg, split, build=build), None)]


def window_batch(tokens: np.ndarray, doc_ids: np.ndarray, *, skip_boundary_targets: bool = False) -> dict:
    """Windows of `seq_len + 1` tokens `[B, seq_len + 1]` and their document ids -> `inputs`, `targets`
    and the inputs' `doc_ids`, `[B, seq_len]` tensors. skip_boundary_targets: a target of another
    document than its input's (a document's first token, predicted from the end of the one before)
    is -100, not scored (docs/training.md, "Documents")."""
    targets = tokens[:, 1:].copy()
    if skip_boundary_targets:
        targets[doc_ids[:, 1:] != doc_ids[:, :-1]] = -100
    return {"inputs": torch.from_numpy(np.ascontiguousarray(tokens[:, :-1])), "targets": torch.from_numpy(targets),
            "doc_ids": torch.from_numpy(np.ascontiguousarray(doc_ids[:, :-1]))}


class Collate:
    """Stack samples into `inputs`/`targets`/`doc_ids` `[B, seq_len]` (`window_batch`); with a
    recall-weighting config also `weights` `[B, seq_len]` from the recall/switch masks of each sample
    (computed from token ids alone, within documents, in the loader workers)."""

    def __init__(self, recall=None, skip_boundary_targets: bool = False):
        self.recall = recall
        self.skip_boundary_targets = skip_boundary_targets

    def __call__(self, samples: list[dict]) -> dict[str, torch.Tensor]:
        tokens = np.stack([s["tokens"] for s in samples]).astype(np.int64)
        doc_ids = np.stack([s["doc_ids"] for s in samples]).astype(np.int64)
        batch = window_batch(tokens, doc_ids, skip_boundary_targets=self.skip_boundary_targets)
        if self.recall is not None:
            batch["weights"] = torch.from_numpy(np.stack([self._weights(t, d) for t, d in zip(tokens, doc_ids)]))
        return batch

    def _weights(self, tokens: np.ndarray, doc_ids: np.ndarray) -> np.ndarray:
        r = self.recall
        f, chi = recall_masks(tokens, doc_ids, ngram=r.ngram, min_distance=r.min_distance,
                              switch_window=r.switch_window)
        # masks are indexed by the target token; targets are tokens[1:]
        return loss_weights(f, chi, beta=r.beta, beta_switch=r.beta_switch)[1:]


def make_streaming_dataset(streams: list[tuple[str, float | None]] | str, *, batch_size: int, shuffle: bool,
                           seed: int, replication: int | None = None, local_cache: str | None = None):
    """A StreamingDataset over one or several MDS datasets, local or remote.

    Remote streams (`s3://...`) are cached under `local_cache/<index>`; proportions
    mix streams (None everywhere: by size). `replication=sp` hands every rank of a
    sequence-parallel group the same samples.
    """
    import hashlib

    from streaming import Stream, StreamingDataset

    close_prefix_probes()
    if isinstance(streams, str):
        streams = [(streams, None)]
    built = []
    for location, proportion in streams:
        if "://" in location:
            if local_cache is None:
                raise ValueError(f"remote dataset {location} needs a local cache directory")
            tag = hashlib.sha1(location.encode()).hexdigest()[:12]
            built.append(Stream(remote=location, local=f"{local_cache}/{tag}", proportion=proportion))
        else:
            built.append(Stream(local=location, proportion=proportion))
    return StreamingDataset(streams=built, batch_size=batch_size, shuffle=shuffle, shuffle_seed=seed,
                            replication=replication if replication and replication > 1 else None)


def _local_shards(locations: list[str]) -> Iterator[tuple[Path, dict]]:
    """(dataset root, index entry) of every shard of the local streams (remote ones are skipped)."""

    for location in locations:
        if "://" in location:
            continue
        for shard in read_index(Path(location)):
            yield Path(location), shard


def check_shard_files(locations: list[str]) -> None:
    """Cheap start-up check of local streams: every shard file present with its indexed size.
    Raises ShardError naming the shard (hashes are checked only when a read fails)."""

    for root, shard in _local_shards(locations):
        candidates = [info for info in (shard.get("zip_data"), shard["raw_data"]) if info]
        present = [info for info in candidates if (root / info["basename"]).is_file()]
        if not present:
            raise ShardError(f"shard {candidates[0]['basename']}: file missing from {root}")
        for info in present:
            size = (root / info["basename"]).stat().st_size
            if size != info["bytes"]:
                raise ShardError(f"shard {info['basename']} in {root}: {size} bytes, index says {info['bytes']}")


def find_bad_shard(locations: list[str]) -> str | None:
    """Read and verify every shard of the local streams; the first problem found, or None."""

    for root, shard in _local_shards(locations):
        try:
            read_shard(root, shard)
        except ShardError as exc:
            return f"{exc} (in {root})"
    return None


class TokenLoader(StreamSource):
    """Endless iterator of batches over a StreamingDataset with exact resume (a batch source,
    `fsframework.data.sources`).

    State = the loader's `state_dict` (epoch + samples seen in it, as streaming's own loader
    writes it) captured after the last batch handed out.
    """

    def __init__(self, dataset, batch_size: int, num_workers: int = 0, recall=None,
                 locations: list[str] | None = None, skip_boundary_targets: bool = False):
        self.dataset = dataset
        self.locations = locations or []
        self.loader = SampleCountingLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                          collate_fn=Collate(recall, skip_boundary_targets), drop_last=True)
        self._iter: Iterator | None = None

    def __iter__(self) -> "TokenLoader":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        for _ in range(2):
            if self._iter is None:
                self._iter = iter(self.loader)
            try:
                return next(self._iter)
            except StopIteration:
                self._iter = None  # next epoch
            except Exception as exc:
                # streaming reports a damaged shard from a background thread without its name
                problem = find_bad_shard(self.locations)
                if problem is None:
                    raise

                raise ShardError(f"cannot read training data: {problem}") from exc
        raise RuntimeError("the dataset yields no full batch: fewer samples than data.micro_batch_size per rank")

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self._iter = None

    def close(self) -> None:
        """Stop the epoch under way. streaming's two read-ahead threads of an iteration end only
        when its epoch does or the next one starts; a loop that stops mid-epoch would leave them
        polling every few milliseconds for as long as the process lives (in a process that trains
        again, or evaluates, each run would add two)."""
        self._iter = None
        iteration = getattr(self.dataset, "_iterator", None)  # streaming's state of the epoch under way
        if iteration is not None:
            iteration.non_blocking_exit()


def close_prefix_probes() -> None:
    """A new StreamingDataset finds a free shared-memory prefix by attaching to every existing one
    (streaming's `prefix._check_and_find`), and streaming registers each attachment with `atexit`,
    which keeps it, and its file descriptor, open for the life of the process: a process that builds
    datasets again and again (evaluation after training, a test worker) holds prefixes x datasets x 6
    descriptors and ends in EMFILE. Attachments made in that module get no `atexit` registration, so
    each closes when dropped; the segments a dataset creates, and the one it attaches to and keeps,
    are as before (an attaching process never unlinks). Idempotent."""
    from streaming.base.shared import prefix

    if getattr(prefix.SharedMemory, "closes_when_dropped", False):
        return
    original = prefix.SharedMemory

    def attach_or_create(name=None, create=None, size=0, auto_cleanup=True):
        return original(name, create, size, auto_cleanup=auto_cleanup and create is not False)

    attach_or_create.closes_when_dropped = True
    prefix.SharedMemory = attach_or_create


def unlink_shared_memory() -> None:
    """Unlink the shared memory blocks that streaming created in this process, leaving them mapped
    (a thread may still read them). For a process about to end with `os._exit` (a second SIGINT,
    fsframework.train.preemption): streaming unlinks them at exit, which `os._exit` skips, and
    multiprocessing's resource tracker would then unlink them itself, warning of leaked objects."""
    import gc

    from streaming.base.shared.memory import SharedMemory

    for obj in gc.get_objects():
        if type(obj) is SharedMemory:  # not isinstance: it would read `__class__` of module proxies, some of which warn
            for shm in obj.created_shms:
                try:
                    shm.unlink()
                except FileNotFoundError:  # unlinked already (a peer process, or streaming itself)
                    pass
