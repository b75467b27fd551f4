"""The language-modelling loss: one weighted next-token cross entropy for every caller.

Training on one process, sequence parallelism (`fsframework.parallel.batch` hands each rank
its own targets with the whole sequence's denominators), validation and the tools all reduce
per-token losses with `weighted_losses`: `lm_losses` from logits, or from the per-token losses a
model's forward returns when it is given the targets (`head_output`), which can run the output
head a chunk of positions at a time (`train.loss_chunk`, docs/training.md) so that the whole
`[B, T, V]` logits never exist.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Denominators(NamedTuple):
    """What the losses divide by: the number of scored targets and the sum of their weights."""

    count: torch.Tensor
    weight_sum: torch.Tensor | None


def loss_denominators(targets: torch.Tensor, weights: torch.Tensor | None = None) -> Denominators:
    """The denominators of the mean (and weighted mean) over `targets` `[B, T]` other than -100."""
    valid = (targets.reshape(-1) != -100).float()
    weight_sum = None if weights is None else (valid * weights.reshape(-1).float()).sum()
    return Denominators(valid.sum(), weight_sum)


def lm_losses(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None,
              denominators: Denominators | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to optimise, plain mean CE) for logits `[B, T, V]` and targets `[B, T]`.

    Without weights both are the mean cross entropy over targets other than -100;
    with weights the first is `sum_t w_t CE_t / sum_t w_t` (docs/freesolo.md §1.10, our choice).
    `denominators`: divide by these instead of this call's own (a sequence-parallel rank scores
    part of a sequence and divides by the whole one's, `fsframework.parallel.batch`).
    """
    return weighted_losses(token_losses(logits, targets), targets, weights, denominators)


def weighted_losses(ce: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None,
                    denominators: Denominators | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`lm_losses` from the per-token losses `ce` `[B, T]` (`token_losses`) instead of the logits."""
    ce = ce.reshape(-1)
    valid = (targets.reshape(-1) != -100).to(ce.dtype)
    count, weight_sum = loss_denominators(targets, weights) if denominators is None else denominators
    plain = (ce * valid).sum() / count.clamp_min(1.0)
    if weights is None:
        return plain, plain
    w = valid * weights.reshape(-1).to(ce.dtype)
    return (ce * w).sum() / weight_sum.clamp_min(1e-12), plain


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy per position `[B, T]` (fp32; 0 where the target is -100) of logits
    `[B, T, V]` (taken in fp32) and targets `[B, T]`."""
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                         reduction="none")
    return ce.view(targets.shape)


def head_output(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor | None = None,
                chunk: int = 0) -> torch.Tensor:
    """What a language model's forward returns from its final hidden states `[B, T, D]`: the
    logits `head(hidden)` `[B, T, V]`, or, given `targets` `[B, T]`, the per-token losses `[B, T]`
    (`token_losses`), the head run `chunk` positions at a time when `chunk > 0`.

    In chunks, the logits of at most `chunk` positions exist at once, in the forward and in the
    backward: each chunk is recomputed there (torch's non-reentrant checkpoint; the head's
    parameters are gathered again under ZeRO-3, as activation checkpointing does), which costs
    one more forward matmul of the head and saves the `[B, T, V]` logits with their fp32 copy and
    gradient. The same losses and gradients up to the rounding of the weight gradient's sum.
    """
    if targets is None:
        return head(hidden)
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets {tuple(targets.shape)} must match the hidden states' positions "
                         f"{tuple(hidden.shape[:-1])}")
    if chunk < 0:
        raise ValueError(f"chunk must be >= 0 (0: the whole logits at once), got {chunk}")
    if chunk == 0 or targets.numel() <= chunk:
        return token_losses(head(hidden), targets)
    rows, flat = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    recompute = torch.is_grad_enabled()
    parts = []
    for lo in range(0, flat.numel(), chunk):
        h, t = rows[lo:lo + chunk], flat[lo:lo + chunk]
        parts.append(checkpoint(_chunk_losses, head, h, t, use_reentrant=False, preserve_rng_state=False)
                     if recompute else _chunk_losses(head, h, t))
    return torch.cat(parts).view(targets.shape)


def _chunk_losses(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return token_losses(head(hidden), targets)
