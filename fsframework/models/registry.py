"""Model registry: a name in `model.name` picks the attention kind and position scheme."""

from __future__ import annotations

from typing import Callable

from torch import nn

from fsframework.config import MODEL_NAMES, ConfigError, ModelConfig


def _freesolo(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    from fsframework.models.freesolo_attention import FreeSoloAttention

    return FreeSoloAttention(cfg, layer_idx)


def _attention_factory(name: str) -> Callable[[ModelConfig, int], nn.Module]:
    from fsframework.models import attention as att

    return {
        "tfpp": att.RopeAttention,
        "swa": att.SlidingWindowAttention,
        "alibi": att.AlibiAttention,
        "sinusoidal": att.NoPositionAttention,
        "fs": _freesolo,
        "fsl": _freesolo,
    }[name]


def build_model(cfg: ModelConfig) -> nn.Module:
    """Instantiate the language model named by `cfg.name`."""
    from fsframework.models.transformer import TransformerLM

    if cfg.name not in MODEL_NAMES:
        raise ConfigError(f"model.name={cfg.name!r} is not registered; choose one of {', '.join(MODEL_NAMES)}")
    return TransformerLM(cfg, _attention_factory(cfg.name), absolute_positions=cfg.name == "sinusoidal")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
