"""The logits proof of a conversion: one fixed batch through the source and the converted model."""

from __future__ import annotations

import torch

PROOF_LENGTH = 64  # tokens per row: several FreeSolo cells and blocks of the small recipes
PROOF_ROWS = 2


def proof_batch(vocab_size: int, length: int = PROOF_LENGTH, rows: int = PROOF_ROWS) -> torch.Tensor:
    """A fixed batch of token ids `[rows, length]` (seeded; ids below 256 and the vocabulary)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, min(vocab_size, 256), (rows, length), generator=gen)


@torch.no_grad()
def logits_of(model, tokens: torch.Tensor) -> torch.Tensor:
    """fp32 logits of `model` (an fsframework model, or a transformers one: its `.logits`)."""
    out = model(tokens)
    return (out.logits if hasattr(out, "logits") else out).float()


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference of two logit tensors of one shape (inf if any is not finite)."""
    if a.shape != b.shape:
        raise ValueError(f"logits of shape {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    diff = (a - b).abs().max()
    return float(diff) if torch.isfinite(a).all() and torch.isfinite(b).all() else float("inf")
