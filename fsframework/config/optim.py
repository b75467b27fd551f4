"""The optimizer and its schedule (`optim.*`; fsframework.train.schedule)."""

from __future__ import annotations

from dataclasses import dataclass

from fsframework.config.checks import ConfigError, choice, positive, positive_fields

DECAYS = ("cosine", "linear", "constant")


@dataclass
class OptimConfig:
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int = 20
    decay: str = "cosine"  # cosine | linear | constant
    grad_clip: float = 1.0


def check_optim(o: OptimConfig) -> None:
    choice("optim.decay", o.decay, DECAYS)
    positive("optim.lr", o.lr)
    positive_fields("optim", o, ("weight_decay", "warmup_steps", "grad_clip"), zero_ok=True)
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        raise ConfigError(f"optim.min_lr_ratio={o.min_lr_ratio} must lie in [0, 1]")
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError(f"optim.betas={list(o.betas)} must be two numbers in [0, 1)")
