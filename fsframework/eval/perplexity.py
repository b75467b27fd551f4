"""Perplexity versus evaluation length on held-out text (lengths may exceed training length).

Two ways to cut the held-out text into windows:
- `perplexity_vs_length` ("perplexity"): consecutive windows of the held-out stream, documents
  packed as training packs them;
- `document_perplexity` ("doc_perplexity"): the first `length + 1` tokens of each held-out document at
  least that long, one document a window, so every position predicts from its own document only
  (what a model trained with document masking is read on; docs/training.md, "Documents").

Each length's score comes with its floor (`LengthScore.floor`): the perplexity of the same targets
under their own token frequencies, what the best model that knows which tokens are common in these
very windows, and nothing of their order or context, would score. A perplexity near it says the
model read little of the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import fsframework.data  # noqa: F401  (streaming without its dataset zoo: fsframework/data/streaming_package.py)
from fsframework.models.language_model import LanguageModel

# the tasks scored as perplexities (lower is better, no 0-100 scale), each with a `<task>_floor` series
PERPLEXITY_TASKS = ("perplexity", "doc_perplexity")


def heldout_tokens(data_dir: str, max_tokens: int) -> np.ndarray:
    """The held-out MDS split as one token stream, in order (at least `max_tokens` when the split holds
    them). Samples are consecutive, disjoint `seq_len + 1`-token cuts of the packed documents
    (`fsframework.data.shards.pack_documents`), so their concatenation, every token kept, is the stream
    as it was packed: no token is skipped at a sample boundary."""
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=data_dir, shuffle=False, batch_size=1)
    chunks, total = [], 0
    for i in range(len(dataset)):
        tokens = dataset[i]["tokens"]  # the last token is a target in training, and the next sample's context here
        chunks.append(tokens)
        total += len(tokens)
        if total >= max_tokens:
            break
    return np.concatenate(chunks).astype(np.int64) if chunks else np.zeros(0, dtype=np.int64)


def heldout_samples(data_dir: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` samples of the held-out MDS split as they are stored: tokens and document ids,
    each `[n, seq_len + 1]` (n <= count), the rows training reads (documents packed as built)."""
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=data_dir, shuffle=False, batch_size=1)
    rows = [dataset[i] for i in range(min(count, len(dataset)))]
    if not rows:
        return np.zeros((0, 0), dtype=np.int64), np.zeros((0, 0), dtype=np.int64)
    return (np.stack([r["tokens"] for r in rows]).astype(np.int64),
            np.stack([r["doc_ids"] for r in rows]).astype(np.int64))


def heldout_documents(data_dir: str, eos_id: int, min_tokens: int, count: int, *, count_at: int = 0,
                      max_tokens: int = 50_000_000) -> list[np.ndarray]:
    """The held-out documents of at least `min_tokens` tokens (their EOS included), in order, until
    `count` of them have at least `count_at` tokens (default `min_tokens`): the split's samples joined
    whole and cut after every EOS (the builder closes each document with one,
    `fsframework.data.shards.pack_documents`); at most `max_tokens` are read."""
    count_at = max(count_at, min_tokens)
    long_enough = 0
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=data_dir, shuffle=False, batch_size=1)
    found, current, read = [], [], 0
    for i in range(len(dataset)):
        tokens = np.asarray(dataset[i]["tokens"]).astype(np.int64)
        read += len(tokens)
        ends = np.flatnonzero(tokens == eos_id)
        begin = 0
        for end in ends:
            current.append(tokens[begin:end + 1])
            document = np.concatenate(current)
            current, begin = [], end + 1
            if len(document) >= min_tokens:
                found.append(document)
                long_enough += len(document) >= count_at
                if long_enough == count:
                    return found
        current.append(tokens[begin:])
        if read >= max_tokens:
            break
    return found


@dataclass(frozen=True)
class LengthScore:
    """A perplexity task's result at one length (module docstring)."""

    perplexity: float  # NaN where nothing was read
    floor: float  # the same targets' perplexity under their own token frequencies (NaN: nothing read)
    count: int  # windows or documents read


def unigram_floor(targets: torch.Tensor) -> float:
    """`exp(-mean log p(t))` over `targets` (any shape), `p` the targets' own frequencies: the lowest
    perplexity a model that ignores the context can reach on exactly these targets."""
    flat = targets.reshape(-1).long()
    if flat.numel() == 0:
        return float("nan")
    counts = torch.bincount(flat).double()
    p = counts[flat] / flat.numel()
    return math.exp(-p.log().mean().item())


@torch.inference_mode()
def document_perplexity(model, tokenizer, lengths: list[int], *, data_dir: str, num_samples: int, batch_size: int,
                        device) -> dict[int, LengthScore]:
    """Per length: the perplexity over the first `length + 1` tokens of up to `num_samples` held-out
    documents of at least that many tokens, its floor and the number of documents read (NaN, NaN and 0
    where none is that long)."""
    documents = heldout_documents(data_dir, tokenizer.eos_id, min(lengths) + 1, num_samples, count_at=max(lengths) + 1)
    results = {}
    for length in lengths:
        rows = [torch.from_numpy(d[:length + 1]) for d in documents if len(d) >= length + 1][:num_samples]
        if not rows:
            results[length] = LengthScore(float("nan"), float("nan"), 0)
            continue
        data = torch.stack(rows)
        nll = sum(sequence_nll(model, batch[:, :-1], batch[:, 1:])
                  for batch in (data[s:s + batch_size].to(device) for s in range(0, len(rows), batch_size)))
        results[length] = LengthScore(math.exp(nll / (len(rows) * length)), unigram_floor(data[:, 1:]), len(rows))
    return results


# output-head positions per row and step: a step's logits are [B LOGIT_CHUNK, V] at any evaluation length
LOGIT_CHUNK = 4096


def sequence_nll(model, inputs: torch.Tensor, targets: torch.Tensor, chunk: int = LOGIT_CHUNK) -> float:
    """Summed next-token cross-entropy of `targets` `[B, T]` given `inputs` `[B, T]`.

    The framework's models score their targets themselves (`forward(tokens, targets=...,
    loss_chunk=...)`, `fsframework.models.losses.head_output`, the training loss's own path), the
    output head run on `chunk` positions of every row at a time, so memory holds `[B chunk, V]`
    logits instead of `[B, T, V]`: at 256k tokens and a 32k vocabulary those would be 34 GB in
    fp32, more than the model's own activations. Any other model is scored from its logits.
    """
    if not isinstance(model, LanguageModel):
        logits = model(inputs).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
    return model(inputs, targets=targets, loss_chunk=chunk * inputs.shape[0]).double().sum().item()


@torch.inference_mode()
def perplexity_vs_length(model, tokenizer, lengths: list[int], *, data_dir: str, num_batches: int, batch_size: int,
                         device) -> dict[int, LengthScore]:
    """Mean next-token perplexity over windows of each length, cut from the held-out stream, with its
    floor and the number of windows read.

    Windows are consecutive, non-overlapping `length + 1`-token slices; a length
    with no full window in the held-out text is reported as NaN (and 0 windows).
    """
    need = max(lengths) * num_batches * batch_size + 1
    stream = torch.from_numpy(heldout_tokens(data_dir, need * 2))
    results: dict[int, float] = {}
    for length in lengths:
        windows = (len(stream) - 1) // (length + 1)
        count = min(windows, num_batches * batch_size)
        if count == 0:
            results[length] = LengthScore(float("nan"), float("nan"), 0)
            continue
        data = stream[: count * (length + 1)].view(count, length + 1)
        nll, n = 0.0, 0
        for start in range(0, count, batch_size):
            batch = data[start:start + batch_size].to(device)
            nll += sequence_nll(model, batch[:, :-1], batch[:, 1:])
            n += batch[:, 1:].numel()
        results[length] = LengthScore(math.exp(nll / n), unigram_floor(data[:, 1:]), count)
    return results
