"""The row term of a FlashAttention-style softmax backward, shared by the attention kernels.

`delta_i = sum_d dO_id * O_id` for outputs `o, do` `[B, T, H, D]`, one program per tile of
`BM` rows of one (batch, head); written fp32 `[B, H, T]`, the layout of the forward's
log-sum-exp, so the backward kernels read both with the same offsets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fsf_kernels.common.utils import next_pow2


@triton.jit
def softmax_bwd_delta_kernel(o, do, delta, T, H, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    o_m = pid_m * BM + tl.arange(0, BM)
    o_d = tl.arange(0, BD)
    mask = (o_m[:, None] < T) & (o_d[None, :] < D)
    off = ((b * T + o_m.to(tl.int64)[:, None]) * H + h) * D + o_d[None, :]
    b_o = tl.load(o + off, mask=mask, other=0.0).to(tl.float32)
    b_do = tl.load(do + off, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta + (b * H + h) * T + o_m, tl.sum(b_o * b_do, 1), mask=o_m < T)


def softmax_bwd_delta(o: torch.Tensor, do: torch.Tensor, rows: int) -> torch.Tensor:
    """delta `[B, H, T]` (fp32) of contiguous `o, do` `[B, T, H, D]`, `rows` rows per program."""
    bsz, seq, heads, dim = o.shape
    delta = torch.empty((bsz, heads, seq), device=o.device, dtype=torch.float32)
    softmax_bwd_delta_kernel[(triton.cdiv(seq, rows), bsz * heads)](
        o, do, delta, seq, heads, D=dim, BD=max(16, next_pow2(dim)), BM=rows,
    )
    return delta
