"""Host-side helpers shared by the kernel launchers."""

from __future__ import annotations

import os

import torch
import triton.language as tl

from fsf_kernels.common.args import check_head_dim

__all__ = ["check_head_dim", "dot_args", "interpreting", "next_pow2"]

_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def next_pow2(x: int) -> int:
    """Smallest power of two >= x (Triton tiles need power-of-two extents)."""
    return 1 << max(0, int(x) - 1).bit_length()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_args(dtype: torch.dtype, fp32_precision: str = "ieee", *, gpu: bool = False) -> dict:
    """Constexprs `DT` (dtype of `tl.dot` operands) and `PREC` (its input_precision).

    Half types feed the tensor cores as they are. fp32 operands use exact
    products ("ieee") unless the caller accepts "tf32". numpy has no bfloat16,
    so the CPU interpreter computes bf16 dots wrongly: there every operand is
    widened to fp32 (bf16 x bf16 products are exact in fp32, so this matches
    tensor-core math up to the summation order). `gpu` asks for the GPU's arguments even under
    the interpreter (compiling for a GPU target, `fsf_kernels.common.targets`).
    """
    if interpreting() and not gpu:
        return dict(DT=tl.float32, PREC="ieee")
    if dtype == torch.float32:
        return dict(DT=tl.float32, PREC=fp32_precision)
    return dict(DT=_TL[dtype], PREC="tf32")  # PREC only applies to fp32 operands

