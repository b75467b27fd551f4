"""`@triton.jit` helpers shared by the kernels (inlined at the call site)."""

import os

import triton
import triton.language as tl

# numpy has no bfloat16, so the CPU interpreter computes bf16 `tl.dot` wrongly;
# under the interpreter both operands are widened to fp32 first. bf16 x bf16
# products are exact in fp32, so this matches tensor-core math up to the
# accumulation order.
_UPCAST = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def mma(a, b, IEEE: tl.constexpr):
    """a @ b with an fp32 accumulator; IEEE keeps fp32 inputs out of tf32."""
    if _UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)
