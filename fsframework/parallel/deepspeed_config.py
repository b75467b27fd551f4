"""The DeepSpeed config a run needs, derived from the framework config."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from fsframework.config import Config
from fsframework.models.registry import attention_kind
from fsframework.parallel.attention import RunsAttention


def use_bf16(cfg: Config) -> bool:
    precision = cfg.parallel.precision
    return precision == "bf16" or (precision == "auto" and torch.cuda.is_available())


def zero3_leaf_classes(cfg: Config, model: Optional[nn.Module] = None) -> list[str]:
    """Module classes ZeRO-3 gathers whole at each call, by fully qualified name: the kind's own (the
    registry says why) and, under the zigzag layout, the attention modules, which run their forward
    once per run (`fsframework.parallel.attention.RunsAttention`): as leaves their projections are
    gathered once per layer call, not once per run (`python tools/bench_zero3_layout.py`: +31% of
    the parameters gathered per step otherwise, where DeepSpeed releases parameters between calls)."""
    leaves = list(attention_kind(cfg.model.name).zero3_leaf_modules)
    runs = {type(m) for m in (model.modules() if model is not None else ()) if isinstance(m, RunsAttention)}
    return leaves + sorted(f"{c.__module__}.{c.__qualname__}" for c in runs)


def deepspeed_config(cfg: Config, model: Optional[nn.Module] = None) -> dict[str, Any]:
    """The engine's config for `cfg`; `model`, the (parallelized) model it will hold, names the ZeRO-3
    leaf modules of its layout."""
    zero: dict[str, Any] = {"stage": cfg.parallel.zero_stage}
    leaves = zero3_leaf_classes(cfg, model)
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
