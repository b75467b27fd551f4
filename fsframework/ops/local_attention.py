"""Sliding-window causal attention with RoPE (docs/freesolo.md §1.2): the reference, and its fused form.

Query `i` attends to keys `j` with `0 <= i - j <= window` (window + 1 keys, self
included); logits are `RoPE(q_i) . RoPE(k_j) / sqrt(d)`. Queries are processed in
chunks so memory is `O(N * (chunk + window))`, never `N x N`. The reference
(`window_attention_reference`, explicit softmax) is what the Triton kernel is
tested against; `window_attention_sdpa` computes the same through PyTorch's fused
attention and is what `impl="auto"` runs where the kernel does not (the CPU).

Shapes: q, k, v `[B, T, H, D]` -> `[B, T, H, D]`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fsf_kernels.common.args import check_window_args
from fsf_kernels.common.support import window_unsupported
from fsframework.ops.dispatch import kernel_for
from fsframework.ops.rope import rotate


def _banded_chunks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, size: int):
    """Query chunks of `size` tokens with the keys and values that cover their band: yields `qc, kc, vc`
    `[B, H, *, D]` in fp32 (fp64 kept for tests) and `band` `[n, m]` (True: query i reads key j).

    Inputs are split once; query chunk c reads key chunks c-1 and c (`size >= window`). (Slicing a
    full tensor per chunk instead would make each chunk's backward allocate a full-size gradient.)
    """
    acc = torch.promote_types(q.dtype, torch.float32)
    # B T H D -> B H T D, split along T
    qs, ks, vs = (x.transpose(1, 2).to(acc).split(size, dim=2) for x in (q, k, v))
    for c, qc in enumerate(qs):
        start = c * size
        kstart = max(0, start - size)
        kc = torch.cat(ks[max(0, c - 1):c + 1], dim=2)
        vc = torch.cat(vs[max(0, c - 1):c + 1], dim=2)
        qi = torch.arange(start, start + qc.shape[2], device=q.device)[:, None]
        kj = torch.arange(kstart, kstart + kc.shape[2], device=q.device)[None, :]
        yield qc, kc, vc, (qi - kj >= 0) & (qi - kj <= window)


def window_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, chunk: int = 256
) -> torch.Tensor:
    """Banded causal softmax attention on already-rotated q/k, chunked over queries (chunks of
    `max(chunk, window)` tokens, `_banded_chunks`), as an explicit masked softmax."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs = []
    for qc, kc, vc, band in _banded_chunks(q, k, v, window=window, size=max(chunk, window)):
        logits = torch.matmul(qc, kc.transpose(-1, -2)) * scale
        probs = torch.softmax(logits.masked_fill(~band, float("-inf")), dim=-1)
        outs.append(torch.matmul(probs, vc))
    return torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype)


def window_attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, chunk: int = 128
) -> torch.Tensor:
    """`window_attention_reference` through PyTorch's fused attention: what `impl="auto"` runs where no
    kernel does (the CPU). Each chunk of `max(chunk, window)` queries reads its band with the band as
    a boolean mask (every query sees itself, so no row is empty). The fused CPU kernel keeps only
    each chunk's output and log-sum-exp for the backward pass, not its probabilities: ~3x faster than
    the reference at the quickstart's shapes, in less memory (`tools/bench_attention.py`). Its
    gradients round differently: with `window=0` the true dq is 0 and this one is rounding noise, so
    the reference, not this, is what kernels are judged by.
    """
    outs = [F.scaled_dot_product_attention(qc, kc, vc, attn_mask=band)
            for qc, kc, vc, band in _banded_chunks(q, k, v, window=window, size=max(chunk, window))]
    return torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype)


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window: int,
    rope_theta: float | None = 10000.0,
    start_pos: int = 0,
    impl: str = "auto",
) -> torch.Tensor:
    """Local branch of FreeSolo and the SWA baseline.

    q, k, v: `[B, T, H, D]`, q/k unrotated; RoPE (base `rope_theta`, absolute
    positions from `start_pos`) is applied here, or skipped when `rope_theta`
    is None. `impl`: "reference", "triton" or "auto" (Triton on CUDA tensors
    when the kernel is importable and supports the call, `window_attention_sdpa`
    elsewhere).
    """
    check_window_args(q, k, v, window)
    kernel = kernel_for("window_attention", "sliding_window_attention", impl, q,
                        window_unsupported(q.dtype, q.shape[-1], rope=rope_theta is not None))
    if kernel is not None:
        return kernel(q, k, v, window=window, rope_theta=rope_theta, start_pos=start_pos)
    if rope_theta is not None:
        q = rotate(q, rope_theta, start_pos)
        k = rotate(k, rope_theta, start_pos)
    if impl == "reference":
        return window_attention_reference(q, k, v, window=window)
    return window_attention_sdpa(q, k, v, window=window)  # "auto" without a kernel: the fused form
