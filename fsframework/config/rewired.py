"""Runway-rewired attention's settings (`model.attention.rewired.*`; model.name=rewired, docs/rewired.md)."""

from __future__ import annotations

from dataclasses import dataclass

from fsframework.config.checks import ConfigError, choice

REWIRED_RUNWAYS = ("last", "mean")
REWIRED_SCORES = ("dot", "bilinear")


@dataclass
class RewiredConfig:
    runway: str = "last"  # last: u_{t-1} | mean: mean(u_0 .. u_{t-1})
    score: str = "dot"  # dot | bilinear (a learned d x d Bmat per layer, identity at init)
    head: int = 0  # the head whose value vectors u also give the runway signal


def check_rewired(r: RewiredConfig, n_heads: int) -> None:
    """Checked whatever the model, so a typo fails early; `n_heads`: model.n_heads."""
    choice("model.attention.rewired.runway", r.runway, REWIRED_RUNWAYS)
    choice("model.attention.rewired.score", r.score, REWIRED_SCORES)
    if not 0 <= r.head < n_heads:
        raise ConfigError(f"model.attention.rewired.head={r.head} must lie in [0, model.n_heads={n_heads})")
