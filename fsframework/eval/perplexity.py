"""Perplexity versus evaluation length on held-out text (lengths may exceed training length)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def heldout_tokens(data_dir: str, max_tokens: int) -> np.ndarray:
    """The held-out MDS split as one token stream, in order (at most `max_tokens`)."""
    import fsframework.data  # noqa: F401  (streaming without its dataset zoo: fsframework/data/streaming_package.py)
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
            logits = model(batch[:, :-1]).float()
            nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1),
                                   reduction="sum").item()
            n += batch[:, 1:].numel()
        results[length] = math.exp(nll / n)
    return results
