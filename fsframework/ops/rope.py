"""Rotary position embedding (RoPE), half-split convention (as in Llama).

Shapes: x is `[B, T, H, D]`; cos/sin are `[T, D/2]` and broadcast over B and H.
"""

from __future__ import annotations

import torch


def rope_cos_sin(
    positions: torch.Tensor, dim: int, theta: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables `[T, dim/2]` for integer `positions` `[T]` (computed in fp32)."""
    if dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {dim}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[B, T, H, D]` by the tables `[T, D/2]`; math in fp32, result in x's dtype."""
    half = x.shape[-1] // 2
    acc = torch.promote_types(x.dtype, torch.float32)
    x1, x2 = x[..., :half].to(acc), x[..., half:].to(acc)
    c, s = cos[None, :, None, :].to(acc), sin[None, :, None, :].to(acc)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


def rotate(x: torch.Tensor, theta: float = 10000.0, start: int = 0) -> torch.Tensor:
    """Apply RoPE to `x` `[B, T, H, D]` at absolute positions `start .. start+T-1`."""
    pos = torch.arange(start, start + x.shape[1], device=x.device)
    cos, sin = rope_cos_sin(pos, x.shape[-1], theta, torch.promote_types(x.dtype, torch.float32))
    return apply_rope(x, cos, sin)
