"""What `fsf run` evaluates after training, and the defaults of `fsf eval` (`eval.*`; fsframework.eval)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsframework.config.checks import positive_fields


@dataclass
class EvalConfig:
    tasks: list = field(default_factory=lambda: ["perplexity"])
    lengths: list = field(default_factory=lambda: [256, 512, 1024])
    num_samples: int = 10  # per task and length (perplexity: windows per length)
    batch_size: int = 2


def check_eval(e: EvalConfig) -> None:
    positive_fields("eval", e, ("num_samples", "batch_size"))
