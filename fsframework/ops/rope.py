"""Rotary position embedding (RoPE), half-split convention (as in Llama).

Shapes: x is `[B, T, H, D]`; cos/sin are `[T, D/2]` and broadcast over B and H.
"""

from __future__ import annotations

import torch

from fsf_kernels.common.rope_tables import rope_cos_sin, rope_rows

__all__ = ["apply_rope", "rope_cos_sin", "rotate"]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[B, T, H, D]` by the tables `[T, D/2]`; math in fp32, result in x's dtype."""
    half = x.shape[-1] // 2
    acc = torch.promote_types(x.dtype, torch.float32)
    x1, x2 = x[..., :half].to(acc), x[..., half:].to(acc)
    c, s = cos[None, :, None, :].to(acc), sin[None, :, None, :].to(acc)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


def rotate(x: torch.Tensor, theta: float = 10000.0, start: int = 0) -> torch.Tensor:
    """Apply RoPE to `x` `[B, T, H, D]` at absolute positions `start .. start+T-1` (the tables' rows
    from the cache of `fsf_kernels.common.rope_tables.rope_rows`)."""
    cos, sin = rope_rows(start, x.shape[1], x.shape[-1], theta, torch.promote_types(x.dtype, torch.float32), x.device)
    return apply_rope(x, cos, sin)
