"""Learning-rate schedule: linear warmup, then cosine / linear decay to `min_lr_ratio * lr`."""

from __future__ import annotations

import math

from fsframework.config import OptimConfig


def lr_factor(step: int, max_steps: int, cfg: OptimConfig) -> float:
    """Multiplier of `cfg.lr` for optimizer step `step` (0-based)."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay == "constant":
        return 1.0
    span = max(1, max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape
