"""Build MDS shards from raw text files: read, tokenize in worker processes, pack, write.

Inputs, by extension:
- `.txt`: the whole file is one document.
- `.jsonl`, `.jsonl.gz`: one JSON object per line; the document is `obj[text_field]`.
- `.parquet`: one document per row of the `text_field` column (needs pyarrow).

Documents keep their boundaries: each is closed by the tokenizer's EOS and packed
by `shards.pack_documents` into the pinned sample format, then written by
`shards.write_mds` (compressed, xxh64-hashed shards plus `index.json`).

What is skipped and what is an error:
- Counted skips (reported in the stats, the build goes on): an empty or
  whitespace-only document (including a blank JSONL line and a JSON `null` or
  parquet null text), text that is not valid UTF-8 (undecodable bytes in a file or
  line, or a lone surrogate escaped in JSON), and text the tokenizer maps to no
  tokens. These are defects of single documents, common in scraped data.
- Errors (`DataBuildError`, naming the file and line or row; nothing is left in
  `out_dir`): a missing or unreadable file, an unknown extension, a corrupt gzip
  stream, malformed JSON, a line that is not a JSON object, a missing text field,
  a text field that is neither a string nor null, a parquet file without the column
  or with a non-text column. These mean the inputs or the options are wrong, so
  a shard built from them would be silently wrong.

Held-out split (docs/training.md, "Validation loss"): whole documents are drawn (seeded,
independent of the number of workers) into `out_dir/eval`, the rest go to `out_dir/train`;
training validation, `fsf eval --tasks perplexity` and `fsf calibrate` read `eval`. By default
`DEFAULT_EVAL_FRACTION` (2%) of the documents are held out, as the embedded corpus holds out
`data.eval_fraction`, so a dataset built without options validates and evaluates. Under that
default the split is made to fill at least one sample: when the drawn documents hold fewer
than `seq_len + 1` tokens, further documents are held out in a seeded order until they do;
when that would leave training less than one sample (a tiny corpus, or a few long documents),
the build has no held-out split and says so. An explicit `eval_fraction` or `eval_docs` is
taken as given (too small a split is an error); `eval_fraction=0` means no split: `out_dir`
itself is then the training dataset.

`build.json` (in `out_dir`) records the recipe, including the tokenizer's identity
(`tokenizers.tokenizer_identity`), which training checks against `data.tokenizer`.

Shards are written to a temporary sibling directory and moved to `out_dir` only when
the build succeeds. Output is identical for any number of workers: documents keep
their input order.
"""

from __future__ import annotations

import gzip
import heapq
import json
import multiprocessing as mp
import math
import os
import random
import shutil
import zlib
from collections import deque
from contextlib import nullcontext
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from fsframework.data.partial_builds import clean_partial_builds, partial_build_dir
from fsframework.data.shards import pack_documents, write_mds
from fsframework.data.tokenizers import load_tokenizer, tokenizer_identity

SKIP_REASONS = ("empty", "invalid_utf8")
DEFAULT_EVAL_FRACTION = 0.02  # held out when neither eval_fraction nor eval_docs is given (as data.eval_fraction)
_EXTENSIONS = (".jsonl.gz", ".jsonl", ".txt", ".parquet")
_CHUNK_BYTES = 1 << 20      # payload bytes per task sent to a worker
_CHUNK_RECORDS = 1024       # ...or this many documents, whichever comes first


class DataBuildError(ValueError):
    """Bad input data or options; the message names the file (and line or row)."""


def input_kind(path: str | Path) -> str:
    name = str(path).lower()
    for ext in _EXTENSIONS:
        if name.endswith(ext):
            return ext
    raise DataBuildError(f"{path}: unknown input extension (expected one of {', '.join(_EXTENSIONS)})")


# ---------------------------------------------------------------- reading (main process)
# A record is (line_or_row, kind, payload, progress_bytes); the worker turns it into
# token ids, a skip reason or an error message. JSON parsing happens in the workers
# too, so the main process only moves bytes.

def _read_txt(path: Path, text_field: str) -> Iterator[tuple]:
    data = path.read_bytes()
    yield 1, "bytes", data, len(data)


def _read_jsonl(path: Path, text_field: str) -> Iterator[tuple]:
    with open(path, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if str(path).lower().endswith(".gz") else raw
        last = 0
        # The raw file position tracks progress in on-disk (compressed) bytes.
        for lineno, line in enumerate(stream, start=1):
            pos = raw.tell()
            yield lineno, "json", line, pos - last
            last = pos


def _read_parquet(path: Path, text_field: str) -> Iterator[tuple]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataBuildError(f"{path}: reading .parquet needs pyarrow (pip install pyarrow)") from exc
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataBuildError(f"{path}: not a readable parquet file: {exc}") from exc
    schema = pf.schema_arrow
    if text_field not in schema.names:
        raise DataBuildError(f"{path}: no column {text_field!r} (columns: {', '.join(schema.names)})")
    col_type = schema.field(text_field).type
    if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)
            or pa.types.is_binary(col_type) or pa.types.is_large_binary(col_type)):
        raise DataBuildError(f"{path}: column {text_field!r} has type {col_type}, expected a string column")
    size, groups = path.stat().st_size, max(1, pf.num_row_groups)
    row = 0
    for group in range(pf.num_row_groups):
        values = pf.read_row_group(group, columns=[text_field]).column(0).to_pylist()
        for k, value in enumerate(values):
            row += 1
            yield row, "value", value, (size // groups if k == len(values) - 1 else 0)


_READERS = {".txt": _read_txt, ".jsonl": _read_jsonl, ".jsonl.gz": _read_jsonl, ".parquet": _read_parquet}


def _records(paths: list[Path], text_field: str) -> Iterator[tuple]:
    """(file index, line, kind, payload, progress bytes) for every document of every file."""
    for fi, path in enumerate(paths):
        try:
            for rec in _READERS[input_kind(path)](path, text_field):
                yield (fi, *rec)
        except DataBuildError:
            raise
        except (OSError, EOFError, zlib.error) as exc:
            # gzip raises BadGzipFile (an OSError) or EOFError on damaged streams
            raise DataBuildError(f"{path}: cannot read: {exc}") from exc


def _chunks(records: Iterable[tuple]) -> Iterator[list[tuple]]:
    chunk, size = [], 0
    for rec in records:
        chunk.append(rec)
        payload = rec[3]
        size += len(payload) if isinstance(payload, (bytes, str)) else 0
        if size >= _CHUNK_BYTES or len(chunk) >= _CHUNK_RECORDS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


# ---------------------------------------------------------------- tokenizing (workers)

_TOKENIZER = None


def _init_worker(tokenizer_spec: str) -> None:
    global _TOKENIZER
    _TOKENIZER = load_tokenizer(tokenizer_spec)


def _text_of(kind: str, payload, text_field: str) -> tuple[str, object]:
    """('text', str) | ('skip', reason) | ('error', message) for one record."""
    if kind == "json":
        if not payload.strip():
            return "skip", "empty"
        try:
            line = payload.decode("utf-8")
        except UnicodeDecodeError:
            return "skip", "invalid_utf8"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            return "error", f"malformed JSON: {exc}"
        if not isinstance(obj, dict):
            return "error", f"expected a JSON object, got {type(obj).__name__}"
        if text_field not in obj:
            return "error", f"no field {text_field!r} (fields: {', '.join(map(str, obj)) or 'none'})"
        payload = obj[text_field]
        if payload is not None and not isinstance(payload, str):
            return "error", f"field {text_field!r} is {type(payload).__name__}, expected a string"
    if payload is None:
        return "skip", "empty"
    if isinstance(payload, bytes):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError:
            return "skip", "invalid_utf8"
    return "text", payload


def _tokenize_chunk(args: tuple[list[tuple], str]) -> tuple[int, list[tuple]]:
    """(input bytes covered, [(file index, line, status, value)]) with status 'ok'
    (int32 token ids), 'skip' (reason) or 'error' (message)."""
    chunk, text_field = args
    out = []
    for fi, line, kind, payload, _ in chunk:
        status, value = _text_of(kind, payload, text_field)
        if status == "text":
            if not value.strip():
                status, value = "skip", "empty"
            else:
                try:
                    ids = _TOKENIZER.encode(value)
                except UnicodeEncodeError:  # lone surrogates from JSON "\ud800" escapes
                    ids = None
                if ids is None:
                    status, value = "skip", "invalid_utf8"
                elif len(ids) == 0:
                    status, value = "skip", "empty"
                else:
                    status, value = "ok", np.asarray(ids, dtype=np.int32)
        out.append((fi, line, status, value))
    return sum(rec[4] for rec in chunk), out


def _ordered_map(fn, tasks: Iterable, workers: int, initargs: tuple) -> Iterator:
    """fn over tasks in order, in `workers` processes, with a bounded number in flight.

    `Pool.imap` would read the whole input ahead into its task queue (no back
    pressure), so tasks are submitted through a window of `4 * workers`.
    """
    if workers <= 1:
        _init_worker(*initargs)
        yield from map(fn, tasks)
        return
    # spawn: safe with threads (progress bar, torch) in the parent, same on every OS
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
        window: deque = deque()
        for task in tasks:
            window.append(pool.apply_async(fn, (task,)))
            if len(window) >= 4 * workers:
                yield window.popleft().get()
        while window:
            yield window.popleft().get()


def tokenize_files(inputs: list[str | Path], *, tokenizer: str = "byte", workers: int = 1,
                   text_field: str = "text") -> Iterator[tuple[int, list[tuple]]]:
    """Read, parse and tokenize every document of `inputs`, in `workers` processes, in input
    order: what `build_shards` does before packing and writing (tokenization throughput is
    measured on it).

    Yields one item per chunk of documents (about 1 MiB or 1024 documents):
    `(input bytes covered, [(file index, line or row, status, value), ...])`, where status is
    `"ok"` (value: the document's int32 token ids, without EOS), `"skip"` (value: one of
    `SKIP_REASONS`) or `"error"` (value: what is wrong with the document). Unreadable files
    and unknown extensions raise `DataBuildError`."""
    paths = [Path(p) for p in inputs]
    tasks = ((chunk, text_field) for chunk in _chunks(_records(paths, text_field)))
    yield from _ordered_map(_tokenize_chunk, tasks, workers, (tokenizer,))


def _checked_inputs(inputs: list[str | Path]) -> list[Path]:
    paths = [Path(p) for p in inputs]
    for path in paths:
        input_kind(path)
        if not path.is_file():
            raise DataBuildError(f"{path}: input file not found")
        if not os.access(path, os.R_OK):
            raise DataBuildError(f"{path}: input file not readable")
    return paths


def read_texts(inputs: list[str | Path], *, text_field: str = "text") -> Iterator[str]:
    """The text of every document of `inputs`, in order, read as `build_shards` reads them: the
    same formats, the same documents skipped and the same errors (`DataBuildError`, naming the
    file and line or row). For tools that need text, not tokens (`fsf data tokenizer`)."""
    paths = _checked_inputs(inputs)
    for fi, line, kind, payload, _ in _records(paths, text_field):
        status, value = _text_of(kind, payload, text_field)
        if status == "error":
            unit = {".txt": None, ".parquet": "row"}.get(input_kind(paths[fi]), "line")
            raise DataBuildError(f"{paths[fi]}" + (f", {unit} {line}" if unit else "") + f": {value}")
        if status == "text" and value.strip():
            yield value


# ---------------------------------------------------------------- held-out split

class HeldOutSplit:
    """Draws held-out documents as they stream past, in input order, from `random.Random(seed)`.

    A `fraction` f: one document at a uniform place in each run of 1/f documents (stratified
    sampling), so every document is held out with probability f and the split holds
    floor(f N) or ceil(f N) of N documents, at least one when f N >= 1: its expected size, not a
    binomial draw around it (30 documents at 0.1 hold out 3, where independent draws held out none
    4% of the time). A `count`: a uniform `count` of them by reservoir sampling (a document a
    later draw displaces goes back to training). The held-out documents stay in memory until the
    training split is written: they are the small part of the data.

    `fill_tokens` (the default split of `build_shards`, with a fraction): the split must hold at
    least that many tokens (one sample), and training too. Every training document gets a seeded
    uniform key (from its own generator, so the fraction's draw is the one `fraction` alone makes);
    the training documents of smallest key that hold `fill_tokens` are kept back as a reserve (the
    rest go to training as they come, a displaced one when it leaves the reserve). At the end, when
    the drawn documents hold fewer than `fill_tokens`, reserve documents join them in key order (a
    uniform draw of further documents) until they do; the rest of the reserve closes the training
    split, in input order. When the split cannot fill one sample and leave training one, nothing is
    held out (`dropped`): the held-out and reserve documents close the training split, in input order.
    """

    def __init__(self, fraction: float, count: int, seed: int, fill_tokens: int = 0):
        if fill_tokens and not fraction:
            raise ValueError("fill_tokens needs a fraction")
        self.fraction, self.count, self.fill_tokens = fraction, count, fill_tokens
        self.rng = random.Random(seed)
        self.held: list[np.ndarray] = []
        self.seen = 0
        self.next_pick = self._pick(0, -1) if fraction else -1  # the index of the next held-out document
        self.filled = 0          # documents held out beyond the fraction's draw to fill one sample
        self.dropped = False     # no split: too few tokens for one sample held out and one trained on
        self._fill_rng = random.Random(f"fill-{seed}")
        self._held_at: list[int] = []   # input index of every held-out document (fill_tokens only)
        self._reserve: list[tuple[float, int, np.ndarray]] = []  # max-heap on key: (-key, index, doc)
        self._reserve_tokens = 0
        self._train_tokens = 0   # tokens (EOS included) of every document not drawn, reserve included

    def train_documents(self, docs: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """The documents of `docs` that training keeps; the others collect in `held`."""
        for doc in docs:
            self.seen += 1
            if self.fraction:
                if self.seen - 1 == self.next_pick:
                    self.held.append(doc)
                    self._held_at.append(self.seen - 1)
                    self.next_pick = self._pick(len(self.held), self.next_pick)
                elif self.fill_tokens:
                    yield from self._keep_back(doc)
                else:
                    yield doc
            elif len(self.held) < self.count:
                self.held.append(doc)
            else:
                slot = self.rng.randrange(self.seen)
                if slot < self.count:
                    self.held[slot], doc = doc, self.held[slot]
                yield doc
        if self.fill_tokens:
            yield from self._fill()

    def _pick(self, k: int, last: int) -> int:
        """The index held out in the k-th run of 1/fraction documents (after `last`, where two
        runs' picks would meet in one document)."""
        return max(math.floor((k + self.rng.random()) / self.fraction), last + 1)

    def _keep_back(self, doc: np.ndarray) -> Iterator[np.ndarray]:
        """Adds a training document to the reserve; yields those the reserve no longer needs (the
        largest keys, while the others still hold `fill_tokens`)."""
        size = len(doc) + 1
        self._train_tokens += size
        heapq.heappush(self._reserve, (-self._fill_rng.random(), self.seen - 1, doc))
        self._reserve_tokens += size
        while self._reserve_tokens - (len(self._reserve[0][2]) + 1) >= self.fill_tokens:
            _, _, out = heapq.heappop(self._reserve)
            self._reserve_tokens -= len(out) + 1
            yield out

    def _fill(self) -> Iterator[np.ndarray]:
        """At the end of the input: fills the split to one sample from the reserve, or drops it."""
        held_tokens = sum(len(d) + 1 for d in self.held)
        by_key = sorted(self._reserve, reverse=True)  # smallest key first
        taken = 0
        while held_tokens < self.fill_tokens and taken < len(by_key):
            held_tokens += len(by_key[taken][2]) + 1
            taken += 1
        joined = [(i, d) for _, i, d in by_key[:taken]]
        kept = [(i, d) for _, i, d in by_key[taken:]]
        left = self._train_tokens - sum(len(d) + 1 for _, d in joined)  # for training
        if held_tokens >= self.fill_tokens and left >= self.fill_tokens:
            held = sorted([*zip(self._held_at, self.held), *joined], key=lambda item: item[0])
            self.held, self.filled = [d for _, d in held], len(joined)
        else:
            kept = [*kept, *joined, *zip(self._held_at, self.held)]
            self.held, self.dropped = [], True
        self._reserve, self._held_at = [], []
        for _, doc in sorted(kept, key=lambda item: item[0]):
            yield doc


# ---------------------------------------------------------------- building

def _prepare_out(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        if not overwrite:
            raise DataBuildError(f"{out_dir}: output directory exists and is not empty (use overwrite)")
        # a build without a split has its index in out_dir, one with a split (the default) in out_dir/train
        if out_dir.is_dir() and not any((out_dir / sub / "index.json").is_file() for sub in (".", "train")):
            raise DataBuildError(f"{out_dir}: refusing to overwrite a directory that is not an MDS dataset")


def shard_summary(out_dir: str | Path) -> dict:
    """Shard count and on-disk bytes from an MDS `index.json`."""
    index = json.loads((Path(out_dir) / "index.json").read_text())
    shards = index["shards"]
    size = sum((s.get("zip_data") or s["raw_data"])["bytes"] for s in shards)
    return {"shards": len(shards), "bytes": size}


def build_shards(inputs: list[str], out_dir: str | Path, *, tokenizer: str = "byte", seq_len: int,
                 workers: int = 1, text_field: str = "text", compression: str | None = "zstd",
                 size_limit: int = 1 << 24, overwrite: bool = False, verbose: bool = True,
                 eval_fraction: float | None = None, eval_docs: int | None = None, seed: int = 0) -> dict:
    """Tokenize `inputs` and write MDS shards of `seq_len + 1`-token samples to `out_dir/train`,
    with whole documents held out in `out_dir/eval` (to `out_dir` itself when nothing is held out).

    Held out (the module docstring): with neither `eval_fraction` nor `eval_docs` (None), the
    default, `DEFAULT_EVAL_FRACTION` of the documents, filled to one sample or dropped when the
    data is too small; otherwise the fraction or count given, an error when it holds less than a
    sample; `eval_fraction=0` (or `eval_docs=0`) alone holds out nothing.

    Returns stats: documents, skipped (per reason), tokens (document tokens incl. EOS),
    tokens_written (in samples; the trailing partial sample is dropped), samples,
    shards, bytes, and with a held-out split eval_documents and eval_samples (and under the
    default eval_filled_documents, those held out beyond the fraction to fill one sample), or
    no_eval_split (why) where the default split was dropped. With `verbose`, shows a progress
    bar and prints the summary.
    """
    from streaming.base.compression import is_compression

    if seq_len < 1:
        raise DataBuildError(f"seq_len must be >= 1, got {seq_len}")
    if workers < 1:
        raise DataBuildError(f"workers must be >= 1, got {workers}")
    if compression in ("", "none"):
        compression = None
    if compression is not None and not is_compression(compression):
        raise DataBuildError(f"unknown compression {compression!r}")
    default_split = eval_fraction is None and eval_docs is None  # the user chose no split size
    eval_fraction = DEFAULT_EVAL_FRACTION if default_split else eval_fraction or 0.0
    eval_docs = eval_docs or 0
    if not 0.0 <= eval_fraction < 1.0:
        raise DataBuildError(f"--eval-fraction {eval_fraction} must lie in [0, 1)")
    if eval_docs < 0 or (eval_docs and eval_fraction):
        raise DataBuildError(f"--eval-docs {eval_docs}: give a count >= 0, or --eval-fraction, not both")
    if not inputs:
        raise DataBuildError("no input files given")
    paths = _checked_inputs(inputs)
    tok = load_tokenizer(tokenizer)
    out_dir = Path(out_dir)
    _prepare_out(out_dir, overwrite)
    for stale in clean_partial_builds(out_dir):  # what killed builds of this output left
        if verbose:
            print(f"removed {stale}: the partial build of a killed `fsf data build`", flush=True)
    tmp_dir = partial_build_dir(out_dir)
    shutil.rmtree(tmp_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)

    stats = {"documents": 0, "skipped": {r: 0 for r in SKIP_REASONS}, "tokens": 0}
    total_bytes = sum(p.stat().st_size for p in paths)
    progress = _progress(verbose)

    def documents(task_id) -> Iterator[list[int]]:
        for advanced, result in tokenize_files(paths, tokenizer=tokenizer, workers=workers, text_field=text_field):
            for fi, line, status, value in result:
                if status == "ok":
                    stats["documents"] += 1
                    stats["tokens"] += len(value) + 1
                    yield value
                elif status == "skip":
                    stats["skipped"][value] += 1
                else:
                    unit = {".txt": None, ".parquet": "row"}.get(input_kind(paths[fi]), "line")
                    where = f"{paths[fi]}" + (f", {unit} {line}" if unit else "")
                    raise DataBuildError(f"{where}: {value}")
            if progress is not None:
                progress.update(task_id, advance=advanced, description=f"{stats['documents']:,} documents")

    split = (HeldOutSplit(eval_fraction, eval_docs, seed, fill_tokens=seq_len + 1 if default_split else 0)
             if eval_fraction or eval_docs else None)
    train_dir = tmp_dir / "train" if split else tmp_dir

    def write(docs, where: Path) -> int:
        return write_mds(pack_documents((d.tolist() for d in docs), seq_len, tok.eos_id), where,
                         compression=compression, size_limit=size_limit)

    try:
        with (progress if progress is not None else nullcontext()):
            task_id = progress.add_task("tokenizing", total=total_bytes) if progress is not None else None
            docs = documents(task_id)
            samples = write(split.train_documents(docs) if split else docs, train_dir)
            if progress is not None:
                progress.update(task_id, completed=total_bytes)
        note = None
        if split and split.dropped:  # the default split, too small: out_dir is the training dataset
            note = (f"no held-out split: {stats['documents']:,} documents of {stats['tokens']:,} tokens do not fill "
                    f"one sample of {seq_len + 1} tokens held out and one for training; validation and perplexity "
                    "need more data, or documents held out with --eval-fraction or --eval-docs")
            split = None
            if train_dir.is_dir():
                for entry in train_dir.iterdir():
                    os.replace(entry, tmp_dir / entry.name)
                train_dir.rmdir()
            train_dir = tmp_dir
        if samples == 0:
            raise DataBuildError(f"inputs hold {stats['tokens']} tokens{' for training' if split else ''}, "
                                 f"fewer than one sample of {seq_len + 1}; nothing written")
        stats.update(samples=samples, tokens_written=samples * (seq_len + 1), **shard_summary(train_dir))
        if note:
            stats.update(no_eval_split=note)
        if split:
            held_tokens = sum(len(d) + 1 for d in split.held)
            eval_samples = write(split.held, tmp_dir / "eval") if held_tokens > seq_len else 0
            if eval_samples == 0:
                raise DataBuildError(f"the {len(split.held)} held-out documents hold {held_tokens} tokens, fewer "
                                     f"than one sample of {seq_len + 1}: raise --eval-fraction or --eval-docs")
            stats.update(eval_documents=len(split.held), eval_samples=eval_samples)
            if default_split:
                stats.update(eval_filled_documents=split.filled)
        recipe = {"inputs": [str(p) for p in paths], "tokenizer": tok.name, "seq_len": seq_len,
                  "text_field": text_field, "compression": compression, "eval_fraction": eval_fraction,
                  "eval_docs": eval_docs, "eval_default": default_split, "seed": seed,
                  "tokenizer_identity": tokenizer_identity(tok)}
        (tmp_dir / "build.json").write_text(json.dumps({"recipe": recipe, "stats": stats}, indent=1))
        if out_dir.exists():
            shutil.rmtree(out_dir) if out_dir.is_dir() else out_dir.unlink()
        os.replace(tmp_dir, out_dir)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    if verbose:
        if note:
            print(note, flush=True)
        print_summary(stats, out_dir)
    return stats


def _progress(verbose: bool):
    if not verbose:
        return None
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())


def print_summary(stats: dict, out_dir: str | Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"MDS shards in {out_dir}", show_header=False)
    skipped = ", ".join(f"{k} {v:,}" for k, v in stats["skipped"].items())
    for key, value in (("documents", f"{stats['documents']:,}"), ("skipped", skipped),
                       ("tokens", f"{stats['tokens']:,}"), ("tokens in samples", f"{stats['tokens_written']:,}"),
                       ("samples", f"{stats['samples']:,}"), ("shards", f"{stats['shards']:,}"),
                       ("bytes", f"{stats['bytes']:,}")):
        table.add_row(key, value)
    if "eval_samples" in stats:
        filled = stats.get("eval_filled_documents")
        table.add_row("held out (eval/)", f"{stats['eval_documents']:,} documents, {stats['eval_samples']:,} samples"
                      + (f" ({filled:,} added to fill one sample)" if filled else ""))
    else:
        table.add_row("held out", "none")
    Console().print(table)
