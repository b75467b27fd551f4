"""The next-token loss of one sequence-parallel rank.

Each rank scores only the targets of its own slice but divides by the target
count (or weight sum) of the WHOLE sequence, so the SP group's losses add up to
the single-process loss. DeepSpeed averages gradients over all `dp * sp` ranks
as if they were data-parallel replicas; multiplying by `sp` turns that average
into the data-parallel average of full-sequence gradients:

    (1 / (dp sp)) sum_g sum_r grad(sp L_gr) = (1 / dp) sum_g grad(L_g),   L_g = sum_r L_gr

The trainer's logged loss (mean over all ranks) is then the DP mean of full losses too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fsframework.parallel.context import SPContext
from fsframework.parallel.sharding import shard_runs


def sequence_parallel_losses(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None,
                             sp: SPContext) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to optimise, plain CE), both scaled by `sp`, for this rank's slice.

    logits: own tokens `[B, n, V]` (the rank's runs, in order); targets (`-100` ignored) and weights: the whole
    sequence `[B, N]` (every rank of the group holds the same sample).
    """
    valid_all = (targets != -100).float()
    own_targets = shard_runs(targets, sp.runs)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), own_targets.reshape(-1), ignore_index=-100,
                         reduction="none")
    valid = shard_runs(valid_all, sp.runs).reshape(-1)
    plain = (ce * valid).sum() / valid_all.sum().clamp_min(1.0) * sp.size
    if weights is None:
        return plain, plain
    w_all = valid_all * weights.float()
    w = shard_runs(w_all, sp.runs).reshape(-1)
    return (ce * w).sum() / w_all.sum().clamp_min(1e-12) * sp.size, plain
