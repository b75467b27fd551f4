"""Data pipeline throughput: tokenizing/building shards, and loading them back.

1. Tokenization: the byte tokenizer over standard-library prose (written as one
   JSONL file), with 1 and 2 worker processes. Reports tokenize-only throughput
   (read, parse, encode) and full `build_shards` throughput (plus packing and
   writing zstd MDS shards), in tokens/s and tokens/s per worker.
2. Loading: StreamingDataset + torch DataLoader over shards built at seq_len 512
   and 4096, batches collated to int64 tensors, with recall masks and loss weights
   (docs/freesolo.md §1.10) computed per sample in the collate function, or not.
3. The CPU trainer's consumption (quickstart model), for the loader/trainer ratio.

    python tools/bench_data.py [--chars 8000000] [--repeat 4] [--loader-tokens 4000000]

Worker-process timings include starting the pool (spawn, about half a second).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def write_corpus(path: Path, chars: int, repeat: int) -> int:
    """The prose as JSONL, `repeat` times over (the stdlib holds only a few MB of it)."""
    from fsframework.data.stdlib_text import stdlib_prose

    docs = stdlib_prose(chars)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(repeat):
            for doc in docs:
                f.write(json.dumps({"text": doc}) + "\n")
    return len(docs) * repeat


def bench_tokenize(path: Path, workers: int) -> tuple[float, int]:
    """Seconds and tokens for read + parse + encode only (no packing or writing)."""
    from fsframework.data.build import tokenize_files

    start = time.perf_counter()
    tokens = 0
    for _, result in tokenize_files([path], tokenizer="byte", workers=workers):
        tokens += sum(len(v) + 1 for _, _, status, v in result if status == "ok")
    return time.perf_counter() - start, tokens


def bench_build(path: Path, out: Path, workers: int, seq_len: int) -> tuple[float, dict]:
    from fsframework.data.build import build_shards

    start = time.perf_counter()
    # no held-out split: every document is timed and `out` is one MDS dataset the loader benchmark reads
    stats = build_shards([str(path)], out, seq_len=seq_len, workers=workers, verbose=False, eval_fraction=0.0)
    return time.perf_counter() - start, stats


def make_collate(masks: bool):
    import torch

    from fsframework.data.masks import loss_weights, recall_masks

    def collate(samples):
        tokens = np.stack([s["tokens"] for s in samples]).astype(np.int64)
        batch = {"inputs": torch.from_numpy(tokens[:, :-1]), "targets": torch.from_numpy(tokens[:, 1:])}
        if masks:
            weights = []
            for s in samples:
                f, chi = recall_masks(s["tokens"], s["doc_ids"])
                weights.append(loss_weights(f, chi)[1:])
            batch["weights"] = torch.from_numpy(np.stack(weights))
        return batch

    return collate


def bench_loader(dataset, seq_len: int, masks: bool, workers: int, max_tokens: int, batch_size: int = 8):
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=make_collate(masks),
                        drop_last=True)
    tokens = 0
    start = time.perf_counter()
    for batch in loader:
        tokens += batch["targets"].numel()
        if tokens >= max_tokens:
            break
    elapsed = time.perf_counter() - start
    del loader
    return elapsed, tokens


def bench_trainer(steps: int = 4) -> float:
    """Tokens/s the CPU trainer consumes: the quickstart model (FreeSolo FS, seq_len 512,
    batch 8), forward + backward + AdamW step, best of `steps` after a warm-up step."""
    import torch

    from fsframework.config import load_config
    from fsframework.models.losses import lm_losses
    from fsframework.models.registry import build_model

    repo = Path(__file__).resolve().parents[1]
    cfg = load_config(repo / "yamls" / "quickstart.yaml")
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (cfg.data.micro_batch_size, cfg.data.seq_len + 1))
    best = float("inf")
    for _ in range(steps + 1):
        start = time.perf_counter()
        lm_losses(model(tokens[:, :-1]), tokens[:, 1:])[0].backward()
        opt.step()
        opt.zero_grad()
        best = min(best, time.perf_counter() - start)
    return cfg.data.micro_batch_size * cfg.data.seq_len / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chars", type=int, default=8_000_000, help="characters of prose to tokenize")
    parser.add_argument("--repeat", type=int, default=4, help="times the prose is written to the corpus file")
    parser.add_argument("--loader-tokens", type=int, default=4_000_000, help="tokens to load per loader run")
    parser.add_argument("--loader-workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()

    import streaming  # noqa: F401  (heavy import, kept out of the timings)
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from rich.console import Console
    from rich.table import Table

    console = Console()
    clean_stale_shared_memory()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "prose.jsonl"
        docs = write_corpus(corpus, args.chars, args.repeat)
        console.print(f"corpus: {docs:,} documents, {corpus.stat().st_size:,} bytes")

        table = Table(title="tokenization (byte tokenizer, stdlib prose)")
        for col in ("stage", "workers", "tokens", "seconds", "tokens/s", "tokens/s per worker"):
            table.add_column(col, justify="right")
        for workers in (1, 2):
            secs, tokens = bench_tokenize(corpus, workers)
            table.add_row("tokenize", str(workers), f"{tokens:,}", f"{secs:.2f}", f"{tokens / secs:,.0f}",
                          f"{tokens / secs / workers:,.0f}")
        built = {}
        for workers in (1, 2):
            secs, stats = bench_build(corpus, tmp / f"build_w{workers}", workers, 4096)
            built[4096] = tmp / f"build_w{workers}"
            table.add_row("build_shards", str(workers), f"{stats['tokens']:,}", f"{secs:.2f}",
                          f"{stats['tokens'] / secs:,.0f}", f"{stats['tokens'] / secs / workers:,.0f}")
        console.print(table)
        console.print("building seq_len 512 shards for the loader ...")

        bench_build(corpus, tmp / "build_512", 2, 512)
        built[512] = tmp / "build_512"
        table = Table(title="loading (StreamingDataset + DataLoader, batch 8)")
        for col in ("seq_len", "masks", "loader workers", "tokens", "seconds", "tokens/s"):
            table.add_column(col, justify="right")
        rates = []
        for seq_len in (512, 4096):
            for workers in args.loader_workers:
                for masks in (False, True):
                    # a fresh dataset per run: a stopped epoch leaves shared-memory state
                    # that a later iterator (in other worker processes) would wait on
                    dataset = StreamingDataset(local=str(built[seq_len]), shuffle=False, batch_size=8)
                    secs, tokens = bench_loader(dataset, seq_len, masks, workers, args.loader_tokens)
                    del dataset
                    clean_stale_shared_memory()
                    rates.append(tokens / secs)
                    table.add_row(str(seq_len), "on" if masks else "off", str(workers), f"{tokens:,}",
                                  f"{secs:.2f}", f"{tokens / secs:,.0f}")
                    console.print(f"  loaded seq_len {seq_len} masks {masks} workers {workers}: "
                                  f"{tokens / secs:,.0f} tokens/s")
        console.print(table)
        trainer_tps = bench_trainer()
        slowest = min(rates)
        console.print(f"CPU trainer (quickstart FS model, seq_len 512): {trainer_tps:,.0f} tokens/s; "
                      f"slowest loader setting above: {slowest:,.0f} tokens/s = {slowest / trainer_tps:.0f}x "
                      "what the trainer consumes (target >= 10x)")


if __name__ == "__main__":
    main()
