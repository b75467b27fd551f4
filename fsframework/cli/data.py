"""`fsf data`: build MDS shards from text files and inspect them."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fsframework.cli.common import fail, flag, input_dir, input_file, output_dir, output_file
from fsframework.data.corpus import embedded_documents
from fsframework.data.tokenizers import train_bpe_tokenizer

data_app = typer.Typer(help="Build MDS training shards from .txt/.jsonl/.jsonl.gz/.parquet files and inspect them.",
                       no_args_is_help=True)


@data_app.command()
def build(
    inputs: List[Path] = typer.Argument(..., help="Input files: .txt (one document each), .jsonl, .jsonl.gz, .parquet"),
    out: Path = typer.Option(..., "--out", help="Output directory for the MDS shards"),
    tokenizer: str = typer.Option("byte", help="'byte', a tokenizer.json or a sentencepiece .model"),
    seq_len: int = typer.Option(4096, "--seq-len", help="Tokens per sample (each sample stores seq_len + 1)"),
    workers: int = typer.Option(1, help="Tokenizer worker processes"),
    text_field: str = typer.Option("text", "--text-field", help="JSON field / parquet column holding the text"),
    compression: str = typer.Option("zstd", help="Shard compression (zstd, gz, ... or none)"),
    shard_bytes: int = typer.Option(1 << 24, "--shard-bytes", help="Largest shard before compression, in bytes"),
    overwrite: bool = flag("Replace an existing MDS dataset in --out", "--overwrite"),
    # None: the user chose no split size, so the default 0.02 is filled to one sample (build_shards)
    eval_fraction: Optional[float] = typer.Option(
        None, "--eval-fraction", help="Fraction of the documents held out in OUT/eval, the rest in OUT/train "
                                      "(default: 0.02, at least one sample; 0: no split, OUT is the training dataset)"),
    eval_docs: Optional[int] = typer.Option(None, "--eval-docs",
                                            help="Number of documents held out in OUT/eval (instead of a fraction)"),
    seed: int = typer.Option(0, help="Seed of the held-out draw"),
) -> None:
    """Tokenize INPUTS and write MDS shards (documents closed by EOS, packed to seq_len + 1).

    Whole documents are held out in OUT/eval (2% by default), which training validation,
    `fsf eval --tasks perplexity` and `fsf calibrate` read; the rest go to OUT/train. Under the
    default, further documents are held out until the split fills one sample, and a corpus too
    small for one sample held out and one trained on is built without a split (a line says so).
    A given --eval-fraction or --eval-docs is taken as is (an error when it holds less than one
    sample); --eval-fraction 0 holds nothing out.

    Example: fsf data build corpus/*.jsonl --out shards/ --tokenizer tokenizer.json --seq-len 4096
    """
    from fsframework.data.build import DataBuildError, build_shards  # numpy: `fsf --help` starts without it

    for path in inputs:
        input_file(path, "input")
    if not overwrite:
        output_dir(out, "--out", remedy="name a new directory, or replace an MDS dataset there with --overwrite")
    elif out.exists() and not out.is_dir():
        fail(f"--out {out}: is a file, not an MDS dataset to overwrite")  # a directory that is none is build_shards'
    tokenizer_file(tokenizer)
    try:
        build_shards([str(p) for p in inputs], out, tokenizer=tokenizer, seq_len=seq_len, workers=workers,
                     text_field=text_field, compression=compression, size_limit=shard_bytes, overwrite=overwrite,
                     eval_fraction=eval_fraction, eval_docs=eval_docs, seed=seed)
    except (DataBuildError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))


@data_app.command()
def inspect(
    directory: Path = typer.Argument(..., help="MDS dataset directory (with index.json)"),
    tokenizer: str = typer.Option("byte", help="Tokenizer used to build the shards"),
    sample: int = typer.Option(0, help="Index of the sample to decode"),
    chars: Optional[int] = typer.Option(600, help="Characters of the decoded sample to print"),
) -> None:
    """Verify every shard (sizes, hashes, samples), print statistics and decode one sample.

    Example: fsf data inspect shards/train --tokenizer tokenizer.json --sample 3
    """
    from fsframework.data.inspect_shards import ShardError, inspect as run_inspect  # numpy, as above

    input_dir(directory, "DIRECTORY", "an MDS dataset directory")
    tokenizer_file(tokenizer)
    try:
        run_inspect(directory, tokenizer, sample, max_chars=chars or 0)
    except (ShardError, FileNotFoundError, ValueError, IndexError) as exc:
        fail(str(exc))


@data_app.command()
def tokenizer(
    out: Path = typer.Argument(..., help="Where to write tokenizer.json"),
    vocab_size: int = typer.Option(2048, "--vocab-size", help="Vocabulary size, EOS included"),
    inputs: List[Path] = typer.Option([], "--input", help="Text files to train on (default: the embedded corpus)"),
    python_chars: int = typer.Option(1_000_000, "--python-chars", help="Embedded corpus: characters of stdlib text"),
    retrieval_docs: int = typer.Option(2000, "--retrieval-docs", help="Embedded corpus: retrieval documents"),
    text_field: str = typer.Option("text", "--text-field", help="JSON field / parquet column holding the text"),
) -> None:
    """Train a byte-level BPE tokenizer.json, on text files or on the embedded corpus.

    Inputs are read as `fsf data build` reads them (.txt, .jsonl, .jsonl.gz, .parquet).

    Example: fsf data tokenizer tokenizer.json --vocab-size 4096 --input notes.jsonl
    """
    from fsframework.data.build import DataBuildError, read_texts  # numpy, as above

    output_file(out, "OUT", replace=False)  # datasets built with a tokenizer record its hash
    for path in inputs:
        input_file(path, "--input")
    if inputs:
        try:
            texts = list(read_texts(inputs, text_field=text_field))  # every error found before training
        except DataBuildError as exc:
            fail(str(exc))
    else:
        texts = embedded_documents(python_chars, retrieval_docs, doc_chars=1000)
    try:
        tok = train_bpe_tokenizer(texts, vocab_size, out)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(f"wrote {out}: vocab {tok.vocab_size}, EOS id {tok.eos_id}")


def tokenizer_file(spec: str) -> None:
    """`--tokenizer`: `byte`, or a tokenizer file that exists."""
    if spec != "byte":
        input_file(Path(spec), "--tokenizer")
