"""Training data: MDS shards read back through mosaicml-streaming.

`build_dataset` prepares the shards named by `cfg.data` (building the embedded
corpus on first use) and `TokenLoader` yields `(inputs, targets, doc_ids)`
batches forever, epoch after epoch, with a `state_dict` that resumes exactly
mid-epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from fsframework.config import Config


def prepare_data_dir(cfg: Config, split: str = "train", *, build: bool = True) -> str:
    """Directory of the MDS dataset for `split` (`train` or `eval`)."""
    data = cfg.data
    if data.source == "embedded":
        root = Path(data.cache_dir)
        if build:
            from fsframework.data.corpus import build_embedded_corpus
            from fsframework.data.tokenizers import load_tokenizer

            build_embedded_corpus(root, load_tokenizer(data.tokenizer), data.seq_len,
                                  python_chars=data.embedded_python_chars,
                                  retrieval_docs=data.embedded_retrieval_docs, eval_fraction=data.eval_fraction,
                                  seed=0)
        return str(root / split)
    root = data.source.rstrip("/")
    if "://" in root:
        return f"{root}/{split}"
    local = Path(root) / split
    if not (local / "index.json").is_file():
        if (Path(root) / "index.json").is_file() and split == "train":
            return root
        raise FileNotFoundError(f"data.source={data.source!r}: no MDS index at {local / 'index.json'}")
    return str(local)


def _collate(samples: list[dict]) -> dict[str, torch.Tensor]:
    tokens = torch.from_numpy(np.stack([s["tokens"] for s in samples]).astype(np.int64))
    doc_ids = torch.from_numpy(np.stack([s["doc_ids"] for s in samples]).astype(np.int64))
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "doc_ids": doc_ids[:, 1:]}


def make_streaming_dataset(path: str, *, batch_size: int, shuffle: bool, seed: int, replication: int | None = None,
                           local_cache: str | None = None):
    """A StreamingDataset over a local MDS directory or a remote prefix (cached in `local_cache`)."""
    from streaming import StreamingDataset

    if "://" in path:
        if local_cache is None:
            raise ValueError(f"remote dataset {path} needs a local cache directory")
        kwargs: dict[str, Any] = {"remote": path, "local": local_cache}
    else:
        kwargs = {"local": path}
    return StreamingDataset(**kwargs, batch_size=batch_size, shuffle=shuffle, shuffle_seed=seed,
                            replication=replication if replication and replication > 1 else None)


class TokenLoader:
    """Endless iterator of batches over a StreamingDataset with exact resume.

    State = the streaming loader's `state_dict` (epoch + samples seen in it)
    captured after the last batch handed out.
    """

    def __init__(self, dataset, batch_size: int, num_workers: int = 0):
        from streaming import StreamingDataLoader

        self.dataset = dataset
        self.loader = StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                          collate_fn=_collate, drop_last=True)
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
        raise RuntimeError("the dataset yields no full batch: fewer samples than data.micro_batch_size per rank")

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self._iter = None
