"""Does a model copy from its context? The loss on the copies of repeated passages.

The batches (`fsframework.data.synthetic.repeat_batch`) pack passages of random tokens,
each followed by itself: the first copy is unpredictable, every token of the second copy
but its first is predictable ONLY by copying. Retrieval (passkey, NIAH) is this skill at
a longer distance, so a model whose second-copy loss equals its first-copy loss cannot
retrieve at any length. Used by `experiments/copy_drill.py` (how many steps until a model
copies).

Legend: B batch, T time, V vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def copy_losses(logits: torch.Tensor, targets: torch.Tensor, first: torch.Tensor,
                second: torch.Tensor) -> tuple[float, float]:
    """Mean next-token loss over the first-copy and the predictable second-copy targets."""
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    return float(nll[first].mean()), float(nll[second].mean())


def copying_onset(records: list[dict], ratio: float = 0.5) -> int | None:
    """First step whose second-copy loss is below `ratio` x its first-copy loss, else None."""
    for record in records:
        if record["second"] < ratio * record["first"]:
            return record["step"]
    return None
