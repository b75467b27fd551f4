"""Rotary position embedding (RoPE), half-split convention (as in Llama).

Shapes: x is `[B, T, H, D]`; cos/sin are `[T, D/2]` and broadcast over B and H.
"""

from __future__ import annotations

import torch

from fsf_kernels.common.rope_tables import rope_cos_sin, rope_rotation_rows, rotate_at

__all__ = ["apply_rope", "rope_cos_sin", "rotate", "rotate_at"]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[B, T, H, D]` by the tables `[T, D/2]`; math in fp32, result in x's dtype. The plain
    form of the rotation, which `rotate` equals bit for bit (tests/ops/test_rope_rows.py)."""
    half = x.shape[-1] // 2
    acc = torch.promote_types(x.dtype, torch.float32)
    x1, x2 = x[..., :half].to(acc), x[..., half:].to(acc)
    c, s = cos[None, :, None, :].to(acc), sin[None, :, None, :].to(acc)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


def rotate(x: torch.Tensor, theta: float = 10000.0, start: int = 0) -> torch.Tensor:
    """Apply RoPE to `x` `[B, T, H, D]` at absolute positions `start .. start+T-1`: `apply_rope`'s
    numbers, bit for bit, as `x * (cos, cos) + (x2, x1) * (-sin, sin)` with cached tables
    (`fsf_kernels.common.rope_tables.rope_rotation_rows`): a decoded token rotates its query and key
    in every layer, and these are half of `apply_rope`'s ops."""
    acc = torch.promote_types(x.dtype, torch.float32)
    cos2, sin2 = rope_rotation_rows(start, x.shape[1], x.shape[-1], theta, acc, x.device)
    # a view of its own (x.to is x itself in fp32): the rotation's gradients are summed here before they
    # meet those of x's other uses (FreeSolo reads q unrotated too), as apply_rope's slices summed them;
    # summed in another order the backward would round differently
    xf, half = x.to(acc).view_as(x), x.shape[-1] // 2
    swapped = torch.cat((xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos2 + swapped * sin2).to(x.dtype)

