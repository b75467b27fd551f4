"""The training loss (`loss.*`; fsframework.models.losses)."""

from __future__ import annotations

from dataclasses import dataclass

from fsframework.config.checks import positive, positive_fields


@dataclass
class LossConfig:
    """Recall-weighted next-token loss (docs/freesolo.md §1.10): `sum w CE / sum w`,
    `w = 1 + beta * recall + beta_switch * switch`; off by default."""

    recall_weighting: bool = False
    beta: float = 9.0
    beta_switch: float = 9.0
    ngram: int = 4
    min_distance: int = 512
    switch_window: int = 64


def check_loss(s: LossConfig) -> None:
    positive_fields("loss", s, ("beta", "beta_switch", "min_distance", "switch_window"), zero_ok=True)
    positive("loss.ngram", s.ngram)
