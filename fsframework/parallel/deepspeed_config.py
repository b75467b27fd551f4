"""The DeepSpeed config a run needs, derived from the framework config."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fsframework.config import Config
from fsframework.models.language_model import LanguageModel


def use_bf16(cfg: Config) -> bool:
    precision = cfg.parallel.precision
    return precision == "bf16" or (precision == "auto" and torch.cuda.is_available())


def zero3_leaf_classes(model: Optional[LanguageModel] = None, documents: bool = False) -> list[str]:
    """Module classes ZeRO-3 gathers whole at each call, by fully qualified name (the form DeepSpeed
    matches them by): what the model says (`LanguageModel.zero3_leaf_modules`: AR-GRC's scan, the
    attention modules under the zigzag layout or with `documents` read apart); none without a model."""
    classes = model.zero3_leaf_modules(documents) if model is not None else []
    return [f"{c.__module__}.{c.__qualname__}" for c in classes]


def deepspeed_config(cfg: Config, model: Optional[LanguageModel] = None) -> dict[str, Any]:
    """The engine's config for `cfg`; `model`, the (parallelized) model it will hold, names the ZeRO-3
    leaf modules of its layout."""
    zero: dict[str, Any] = {"stage": cfg.parallel.zero_stage}
    leaves = zero3_leaf_classes(model, cfg.data.document_masking)
    if cfg.parallel.zero_stage == 3 and leaves:
        zero["leaf_module"] = {"classes": leaves}
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
