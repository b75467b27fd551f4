"""Perplexity versus evaluation length on held-out text (lengths may exceed training length)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

import fsframework.data  # noqa: F401  (streaming without its dataset zoo: fsframework/data/streaming_package.py)
from fsframework.models.language_model import LanguageModel


def heldout_tokens(data_dir: str, max_tokens: int) -> np.ndarray:
    """The held-out MDS split as one token stream, in order (at most `max_tokens`)."""
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=data_dir, shuffle=False, batch_size=1)
    chunks, total = [], 0
    for i in range(len(dataset)):
        tokens = dataset[i]["tokens"][:-1]  # consecutive samples overlap by nothing; drop the spare target
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
                         device) -> dict[int, float]:
    """Mean next-token perplexity over windows of each length, cut from the held-out stream.

    Windows are consecutive, non-overlapping `length + 1`-token slices; a length
    with no full window in the held-out text is reported as NaN.
    """
    need = max(lengths) * num_batches * batch_size + 1
    stream = torch.from_numpy(heldout_tokens(data_dir, need * 2))
    results: dict[int, float] = {}
    for length in lengths:
        windows = (len(stream) - 1) // (length + 1)
        count = min(windows, num_batches * batch_size)
        if count == 0:
            results[length] = float("nan")
            continue
        data = stream[: count * (length + 1)].view(count, length + 1)
        nll, n = 0.0, 0
        for start in range(0, count, batch_size):
            batch = data[start:start + batch_size].to(device)
            nll += sequence_nll(model, batch[:, :-1], batch[:, 1:])
            n += batch[:, 1:].numel()
        results[length] = math.exp(nll / n)
    return results
