"""Language models: the registry of attention kinds, their modules and the decoder around them."""

from fsframework.models.registry import KINDS, MODEL_NAMES, attention_kind, build_model, count_parameters

__all__ = ["KINDS", "MODEL_NAMES", "attention_kind", "build_model", "count_parameters"]
