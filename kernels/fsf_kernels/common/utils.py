"""Host-side helpers shared by the kernel launchers."""

from __future__ import annotations

import os

import torch
import triton.language as tl

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def next_pow2(x: int) -> int:
    """Smallest power of two >= x (Triton tiles need power-of-two extents)."""
    return 1 << max(0, int(x) - 1).bit_length()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_args(dtype: torch.dtype, fp32_precision: str = "ieee") -> dict:
    """Constexprs `DT` (dtype of `tl.dot` operands) and `PREC` (its input_precision).

    Half types feed the tensor cores as they are. fp32 operands use exact
    products ("ieee") unless the caller accepts "tf32". numpy has no bfloat16,
    so the CPU interpreter computes bf16 dots wrongly: there every operand is
    widened to fp32 (bf16 x bf16 products are exact in fp32, so this matches
    tensor-core math up to the summation order).
    """
    if interpreting():
        return dict(DT=tl.float32, PREC="ieee")
    if dtype == torch.float32:
        return dict(DT=tl.float32, PREC=fp32_precision)
    return dict(DT=_TL[dtype], PREC="tf32")  # PREC only applies to fp32 operands


def check_head_dim(name: str, x: torch.Tensor, even: bool = False) -> None:
    """Raise ValueError unless `x` has a supported dtype and head dim."""
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    d = x.shape[-1]
    if d < 1 or d > 256:
        raise ValueError(f"{name}: head dim must be in [1, 256], got {d}")
    if even and d % 2:
        raise ValueError(f"{name}: RoPE needs an even head dim, got {d}")
