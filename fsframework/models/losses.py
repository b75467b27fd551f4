"""The language-modelling loss: one weighted next-token cross entropy for every caller.

Training on one process, sequence parallelism (`fsframework.parallel.batch` hands each rank
its own targets with the whole sequence's denominators), validation and the tools all call
`lm_losses`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


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
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                         reduction="none")
    valid = (targets.reshape(-1) != -100).to(ce.dtype)
    count, weight_sum = loss_denominators(targets, weights) if denominators is None else denominators
    plain = (ce * valid).sum() / count.clamp_min(1.0)
    if weights is None:
        return plain, plain
    w = valid * weights.reshape(-1).to(ce.dtype)
    return (ce * w).sum() / weight_sum.clamp_min(1e-12), plain
