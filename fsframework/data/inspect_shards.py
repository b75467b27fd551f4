"""Check and summarize an MDS dataset in the pinned sample format (`tokens`, `doc_ids`).

Every shard named by `index.json` is read in full: the file must exist, match the
size and xxh64 hash recorded in the index (compressed file, then its decompressed
contents), and decode into samples of equal length. Any failure raises
`ShardError` naming the shard, so a damaged dataset is caught before training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fsframework.data.tokenizers import load_tokenizer


class ShardError(ValueError):
    """A missing, damaged or malformed shard or index; the message names the file."""


def _check_hashes(name: str, data: bytes, info: dict) -> None:
    from streaming.base.hashing import get_hash

    if info.get("bytes") is not None and len(data) != info["bytes"]:
        raise ShardError(f"shard {name}: {len(data)} bytes, index says {info['bytes']}")
    for algo, expected in (info.get("hashes") or {}).items():
        if get_hash(algo, data) != expected:
            raise ShardError(f"shard {name}: {algo} hash mismatch (corrupt file)")


def _read(path: Path, name: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ShardError(f"shard {name}: unreadable: {exc}") from exc


def read_shard(root: Path, shard: dict) -> list[dict]:
    """All samples of one shard, after checking sizes and hashes.

    A compressed dataset may also hold decompressed copies (the loader leaves them
    next to the compressed files and reads those first), so every copy present is
    checked; the shard is missing only when neither is there.
    """
    from streaming.base.compression import decompress
    from streaming.base.format.mds.reader import MDSReader

    raw_info, zip_info = shard["raw_data"], shard.get("zip_data")
    raw_path = root / raw_info["basename"]
    zip_path = root / zip_info["basename"] if zip_info else None
    name = (zip_info or raw_info)["basename"]
    data = None
    if zip_path is not None and zip_path.is_file():
        packed = _read(zip_path, name)
        _check_hashes(name, packed, zip_info)
        try:
            data = decompress(shard["compression"], packed)
        except Exception as exc:  # the codecs raise assorted types on bad input
            raise ShardError(f"shard {name}: cannot decompress ({shard['compression']}): {exc}") from exc
        _check_hashes(name, data, raw_info)
    if raw_path.is_file():
        name = raw_info["basename"]
        data = _read(raw_path, name)
        _check_hashes(name, data, raw_info)
    if data is None:
        raise ShardError(f"shard {name}: file missing from {root}")
    reader = MDSReader.from_json(str(root), None, shard)
    # MDS layout: uint32 sample count, uint32 offsets[count + 1], then the samples
    count = int(np.frombuffer(data[:4], np.uint32)[0])
    if count != shard["samples"]:
        raise ShardError(f"shard {name}: holds {count} samples, index says {shard['samples']}")
    offsets = np.frombuffer(data[4:4 + 4 * (count + 1)], np.uint32)
    try:
        return [reader.decode_sample(data[offsets[i]:offsets[i + 1]]) for i in range(count)]
    except Exception as exc:
        raise ShardError(f"shard {name}: undecodable sample: {exc}") from exc


def read_index(root: Path) -> list[dict]:
    """The shard entries of the MDS dataset at `root`; ShardError when its index.json is missing or malformed."""
    index_path = root / "index.json"
    if not index_path.is_file():
        raise ShardError(f"{root}: no index.json (not an MDS dataset; build one with `fsf data build`)")
    try:
        shards = json.loads(index_path.read_text())["shards"]
        if not isinstance(shards, list):
            raise TypeError(f"'shards' is {type(shards).__name__}, expected a list")
        return shards
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ShardError(f"{index_path}: malformed index: {exc}") from exc


def inspect(directory: str | Path, tokenizer: str = "byte", sample: int = 0, *, max_chars: int = 600,
            verbose: bool = True) -> dict:
    """Verify every shard and return (and with `verbose` print) statistics and one decoded sample."""
    root = Path(directory)
    shards = read_index(root)
    tok = load_tokenizer(tokenizer)

    samples = tokens = eos = 0
    docs_per_sample: list[int] = []
    width = None
    picked = None
    for shard in shards:
        name = (shard.get("zip_data") or shard["raw_data"])["basename"]
        if not {"tokens", "doc_ids"} <= set(shard.get("column_names") or []):
            raise ShardError(f"shard {name}: columns {shard.get('column_names')}, expected tokens and doc_ids")
        for s in read_shard(root, shard):
            tok_ids, doc_ids = np.asarray(s["tokens"]), np.asarray(s["doc_ids"])
            if width is None:
                width = tok_ids.shape[0]
            if tok_ids.shape[0] != width or doc_ids.shape[0] != width:
                raise ShardError(f"shard {name}: sample of {tok_ids.shape[0]} tokens, expected {width}")
            if samples == sample:
                picked = s
            samples += 1
            tokens += width
            eos += int((tok_ids == tok.eos_id).sum())
            docs_per_sample.append(int(doc_ids[-1] - doc_ids[0]) + 1)
    zip_bytes = sum((s.get("zip_data") or s["raw_data"])["bytes"] for s in shards)
    raw_bytes = sum(s["raw_data"]["bytes"] for s in shards)
    stats = {"shards": len(shards), "samples": samples, "seq_len": (width - 1) if width else 0,
             "tokens": tokens, "eos": eos,
             "docs_per_sample": float(np.mean(docs_per_sample)) if docs_per_sample else 0.0,
             "bytes": zip_bytes, "raw_bytes": raw_bytes}
    if samples and not 0 <= sample < samples:
        raise IndexError(f"sample {sample} out of range: the dataset has {samples} samples")
    if picked is not None:
        stats["sample"] = sample
        stats["sample_text"] = _render(tok, np.asarray(picked["tokens"]), np.asarray(picked["doc_ids"]))
    if verbose:
        _print(root, stats, max_chars)
    return stats


def _render(tok, tokens: np.ndarray, doc_ids: np.ndarray) -> str:
    """Decoded text of a sample with each document's EOS shown as <eos>."""
    parts = []
    for d in np.unique(doc_ids):
        ids = tokens[doc_ids == d]
        closed = ids.shape[0] > 0 and ids[-1] == tok.eos_id
        parts.append(tok.decode(ids[:-1] if closed else ids) + ("<eos>" if closed else ""))
    return "".join(parts)


def _print(root: Path, stats: dict, max_chars: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"MDS dataset {root}", show_header=False)
    for key in ("shards", "samples", "seq_len", "tokens", "eos", "docs_per_sample", "bytes", "raw_bytes"):
        value = stats[key]
        table.add_row(key, f"{value:,.2f}" if isinstance(value, float) else f"{value:,}")
    console = Console()
    console.print(table)
    if "sample_text" in stats:
        text = stats["sample_text"]
        console.print(f"[bold]sample {stats['sample']}[/bold] (first {min(max_chars, len(text))} of {len(text)} chars):")
        console.print(text[:max_chars], markup=False, highlight=False)
