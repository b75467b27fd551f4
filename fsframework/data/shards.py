"""Packing token documents into fixed-length samples and writing them as MDS shards.

Sample format (pinned; the loader, the data tools and the trainer rely on it):
each MDS sample is one training sequence of `seq_len + 1` tokens with columns
- `tokens`:  ndarray int32 `[seq_len + 1]` (inputs are `[:-1]`, targets `[1:]`)
- `doc_ids`: ndarray int32 `[seq_len + 1]`, non-decreasing document index within the
  sample (the EOS closing a document belongs to that document).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

MDS_COLUMNS = {"tokens": "ndarray:int32", "doc_ids": "ndarray:int32"}


def pack_documents(docs: Iterable[list[int]], seq_len: int, eos_id: int) -> Iterator[dict]:
    """Concatenate documents (each closed by EOS) and cut into `seq_len + 1` windows.
    A trailing partial window is dropped; documents may span windows."""
    width = seq_len + 1
    buf_tok: list[int] = []
    buf_doc: list[int] = []
    doc_counter = 0
    for doc in docs:
        buf_tok.extend(doc)
        buf_tok.append(eos_id)
        buf_doc.extend([doc_counter] * (len(doc) + 1))
        doc_counter += 1
        while len(buf_tok) >= width:
            tok = np.asarray(buf_tok[:width], dtype=np.int32)
            ids = np.asarray(buf_doc[:width], dtype=np.int64)
            del buf_tok[:width], buf_doc[:width]
            yield {"tokens": tok, "doc_ids": (ids - ids[0]).astype(np.int32)}


def write_mds(samples: Iterable[dict], out_dir: str | Path, *, compression: str | None = "zstd",
              size_limit: int = 1 << 24) -> int:
    """Write samples with `streaming.MDSWriter` (hashed shards + index.json); returns the count."""
    from streaming import MDSWriter

    count = 0
    with MDSWriter(out=str(out_dir), columns=MDS_COLUMNS, compression=compression, hashes=["xxh64"],
                   size_limit=size_limit) as writer:
        for sample in samples:
            writer.write(sample)
            count += 1
    return count
