"""Language-modelling losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lm_losses(logits: torch.Tensor, targets: torch.Tensor,
              weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to optimise, plain mean CE) for logits `[B, T, V]` and targets `[B, T]`.

    Without weights both are the mean cross entropy over targets other than -100;
    with weights the first is `sum_t w_t CE_t / sum_t w_t` (docs/freesolo.md §1.10, our choice).
    """
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                         reduction="none")
    valid = (targets.reshape(-1) != -100).to(ce.dtype)
    plain = (ce * valid).sum() / valid.sum().clamp_min(1.0)
    if weights is None:
        return plain, plain
    w = valid * weights.reshape(-1).to(ce.dtype)
    return (ce * w).sum() / w.sum().clamp_min(1e-12), plain
