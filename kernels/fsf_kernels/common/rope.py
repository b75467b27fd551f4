"""RoPE pre-pass (half-split, as fsframework.ops.rope) as a Triton kernel.

Forward rotates by +theta_t, backward by -theta_t (a rotation's transpose is
its inverse). Tables come from `fsf_kernels.common.rope_tables` (shared with
the reference `fsframework.ops.rope`), computed in fp64 and rounded to fp32, so
long positions keep the reference's accuracy.

Shapes: x `[B, T, H, D]` (any strides) -> contiguous `[B, T, H, D]`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fsf_kernels.common.rope_tables import rope_tables
from fsf_kernels.common.utils import next_pow2

__all__ = ["rope_apply", "rope_kernel", "rope_tables"]


@triton.jit
def rope_kernel(
    x, y, cos, sin,
    s_xb, s_xt, s_xh,
    T, H,
    HALF: tl.constexpr, BH: tl.constexpr, BT: tl.constexpr, SIGN: tl.constexpr,
):
    pid_t, pid_bh = tl.program_id(0), tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    o_t = pid_t * BT + tl.arange(0, BT)
    o_d = tl.arange(0, BH)
    mask = (o_t[:, None] < T) & (o_d[None, :] < HALF)
    row = o_t.to(tl.int64)
    p_x = x + b.to(tl.int64) * s_xb + h.to(tl.int64) * s_xh + row[:, None] * s_xt + o_d[None, :]
    x1 = tl.load(p_x, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p_x + HALF, mask=mask, other=0.0).to(tl.float32)
    p_cs = row[:, None] * HALF + o_d[None, :]
    c = tl.load(cos + p_cs, mask=mask, other=0.0)
    s = tl.load(sin + p_cs, mask=mask, other=0.0) * SIGN
    # y is contiguous [B, T, H, D]
    p_y = y + ((b.to(tl.int64) * T + row[:, None]) * H + h) * (2 * HALF) + o_d[None, :]
    tl.store(p_y, (x1 * c - x2 * s).to(y.dtype.element_ty), mask=mask)
    tl.store(p_y + HALF, (x1 * s + x2 * c).to(y.dtype.element_ty), mask=mask)


def rope_apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rotate x `[B, T, H, D]` (math in fp32) into a new contiguous tensor."""
    bsz, seq, heads, dim = x.shape
    y = torch.empty((bsz, seq, heads, dim), device=x.device, dtype=out_dtype or x.dtype)
    if x.stride(3) != 1:
        x = x.contiguous()
    half = dim // 2
    bt = 32
    grid = (triton.cdiv(seq, bt), bsz * heads)
    rope_kernel[grid](
        x, y, cos, sin, x.stride(0), x.stride(1), x.stride(2), seq, heads,
        HALF=half, BH=next_pow2(half), BT=bt, SIGN=-1.0 if inverse else 1.0,
    )
    return y
