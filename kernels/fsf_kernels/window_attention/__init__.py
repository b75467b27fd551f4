"""Sliding-window causal attention with RoPE (docs/freesolo.md §1.2)."""

from fsf_kernels.window_attention.window_attention import (
    WindowAttentionFunction,
    sliding_window_attention,
    window_attention_bwd,
    window_attention_fwd,
)

__all__ = ["WindowAttentionFunction", "sliding_window_attention", "window_attention_bwd", "window_attention_fwd"]
