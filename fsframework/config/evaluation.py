"""What `fsf run` evaluates after training, and the defaults of `fsf eval` (`eval.*`; fsframework.eval)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fsframework.config.checks import ConfigError, positive_fields


@dataclass
class EvalConfig:
    tasks: list = field(default_factory=lambda: ["perplexity"])  # "ruler": the 13 RULER tasks
    lengths: list = field(default_factory=lambda: [256, 512, 1024])
    num_samples: int = 10  # per task and length (perplexity: windows per length)
    batch_size: int = 2
    # the folder of the RULER QA tasks' official files (dev-v2.0.json, hotpot_dev_distractor_v1.json;
    # docs/evaluation.md §4.1); `fsf eval --ruler-data` replaces it
    ruler_data: Optional[str] = None
    ruler_qa2_from: int = 8192  # the RULER suite mean adds qa_2 from this length on (the paper: 8k)
    # skip the longer lengths once the S-NIAH mean at a length is below ruler_fail_below (the paper's protocol)
    stop_after_failure: bool = False
    ruler_fail_below: float = 10.0


def check_eval(e: EvalConfig) -> None:
    positive_fields("eval", e, ("num_samples", "batch_size", "ruler_qa2_from"))
    if not 0 <= e.ruler_fail_below <= 100:
        raise ConfigError(f"eval.ruler_fail_below={e.ruler_fail_below} must be a score in [0, 100]")
