"""Runway-rewired causal attention (docs/rewired.md)."""

from fsf_kernels.rewired_attention.rewired_attention import (
    RewiredAttentionFunction,
    rewired_attention_rows,
    rewired_bwd,
    rewired_fwd,
)

__all__ = ["RewiredAttentionFunction", "rewired_attention_rows", "rewired_bwd", "rewired_fwd"]
