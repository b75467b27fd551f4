"""Attention for queries at an offset: the one form every attention kind is written in.

Legend: B batch, n queries, m keys, H heads, d head width, w window.

Queries sit at absolute positions `[start, start + n)`; the keys handed in cover
the positions `[start + n - m, start + n)`, i.e. they END with the queries' own
positions. Full causal kinds need the whole prefix (`m = start + n`); windowed
kinds need at least the `w` keys before `start` (`m >= n + min(w, start)`).
Where the earlier keys come from (the same sequence, a sequence-parallel
gather or halo, a decode cache) is the caller's business
(docs/architecture.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from fsframework.ops.local_attention import sliding_window_attention


def causal_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """Causal softmax attention of queries at `[start, start + n)` over keys `[0, start + n)`.

    q `[B, n, H, d]`, k/v `[B, start + n, H, d]`, optional additive `bias` `[H, n, start + n]`.
    """
    n, total = q.shape[1], k.shape[1]
    if total != start + n:
        raise ValueError(f"queries at [{start}, {start + n}) need keys [0, {start + n}), got {total}")
    if bias is None and start > 0 and not q.is_cuda:
        # On the CPU, SDPA has no fused kernel for a bottom-right causal mask: it materialises the
        # mask and keeps the [H, n, start + n] probabilities for backward (650 MB for 8k queries
        # over 16k keys, 4 heads). Zero queries in front make the call square and top-left causal,
        # which the fused kernel runs in O(start + n) memory; their outputs are dropped (extra
        # work start^2 / 2 scores per head).
        q_pad = torch.cat((q.new_zeros((q.shape[0], start, *q.shape[2:])), q), dim=1)
        y = F.scaled_dot_product_attention(q_pad.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return y.transpose(1, 2)[:, start:]
    if bias is None:
        # j <= i + start: a bottom-right aligned causal mask, which SDPA runs on its fused GPU kernels
        # (an explicit boolean mask falls back to the slower unfused path)
        mask = causal_lower_right(n, total)
    else:
        i = torch.arange(start, start + n, device=q.device)[:, None]
        j = torch.arange(total, device=q.device)[None, :]
        mask = (bias.to(q.dtype).masked_fill(j > i, float("-inf")))[None]
    # B T H D -> B H T D for SDPA, and back
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return y.transpose(1, 2)


def alibi_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, slopes: torch.Tensor,
                       chunk: int = 512) -> torch.Tensor:
    """ALiBi attention (bias `-slope_h * (i - j)`) of queries at `[start, start + n)` over keys
    `[0, start + n)`, `chunk` queries at a time so the bias never exceeds `H x chunk x keys`."""
    out = []
    for lo in range(0, q.shape[1], chunk):
        hi = min(lo + chunk, q.shape[1])
        i = torch.arange(start + lo, start + hi, device=q.device)[:, None]
        j = torch.arange(0, start + hi, device=q.device)[None, :]
        bias = -slopes.to(q.dtype)[:, None, None] * (i - j).to(q.dtype)  # H, n, keys
        out.append(causal_attention_at(q[:, lo:hi], k[:, : start + hi], v[:, : start + hi], start + lo, bias=bias))
    return torch.cat(out, dim=1)


def window_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, *, window: int,
                        rope_theta: float | None, impl: str = "auto") -> torch.Tensor:
    """Sliding-window attention (`0 <= i - j <= window`, RoPE inside) of queries at
    `[start, start + n)` over keys `[start + n - m, start + n)`.

    q `[B, n, H, d]` unrotated; k/v `[B, m, H, d]` unrotated, `m - n >= min(window, start)`.
    Keys further back than the window are dropped; the remaining halo positions get
    zero queries whose outputs are dropped (the op takes equal-length q/k/v; the
    extra work is bounded by the window).
    """
    n = q.shape[1]
    halo = k.shape[1] - n
    if halo < min(window, start) or halo > start:
        raise ValueError(f"queries at [{start}, {start + n}) with window {window} need between "
                         f"{min(window, start)} and {start} keys before them, got {halo}")
    if halo > window:
        k, v, halo = k[:, halo - window:], v[:, halo - window:], window
    if halo == 0:
        return sliding_window_attention(q, k, v, window=window, rope_theta=rope_theta, start_pos=start, impl=impl)
    q_pad = torch.cat((q.new_zeros((q.shape[0], halo, *q.shape[2:])), q), dim=1)
    out = sliding_window_attention(q_pad, k, v, window=window, rope_theta=rope_theta, start_pos=start - halo,
                                   impl=impl)
    return out[:, halo:]
