"""The DeepSpeed config a run needs, derived from the framework config."""

from __future__ import annotations

from typing import Any

import torch

from fsframework.config import Config
from fsframework.models.registry import attention_kind


def use_bf16(cfg: Config) -> bool:
    precision = cfg.parallel.precision
    return precision == "bf16" or (precision == "auto" and torch.cuda.is_available())


def deepspeed_config(cfg: Config) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": cfg.parallel.zero_stage}
    leaves = attention_kind(cfg.model.name).zero3_leaf_modules
    if cfg.parallel.zero_stage == 3 and leaves:  # gathered whole at each call (the registry says why)
        zero["leaf_module"] = {"classes": list(leaves)}
    return {
        "train_micro_batch_size_per_gpu": cfg.data.micro_batch_size,
        "gradient_accumulation_steps": cfg.parallel.grad_accum,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": use_bf16(cfg)},
        # the optimizer is a plain torch AdamW handed to deepspeed.initialize (no JIT-built extension)
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**12,
        "wall_clock_breakdown": False,
    }
