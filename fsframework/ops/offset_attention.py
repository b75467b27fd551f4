"""Attention for queries at an offset: the one form every attention kind is written in.

Legend: B batch, n queries, m keys, H heads, d head width, w window.

Queries sit at absolute positions `[start, start + n)`; the keys handed in cover
the positions `[start + n - m, start + n)`, i.e. they END with the queries' own
positions. Full causal kinds need the whole prefix (`m = start + n`); windowed
kinds need at least the `w` keys before `start` (`m >= n + min(w, start)`).
Where the earlier keys come from (the same sequence, a sequence-parallel
gather or halo, a decode cache) is the caller's business
(docs/architecture.md).

The call is chosen by its shape (docs/architecture.md, "One computation per attention
kind"): few queries over many keys (decoding, prefill chunks) cost what the math costs,
`n x m` scores; many queries (a sequence-parallel rank's slice) keep the fused square call
and its linear memory.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fsframework.ops.local_attention import sliding_window_attention
from fsframework.ops.rope import rotate


def mask_queries(q: torch.Tensor) -> int:
    """Most queries one explicit-mask call takes on the CPU: `B H d`. With `n <= B H d` and
    `n <= start`, the `[n, start + n]` mask (one for the batch and the heads) holds at most
    `2 B H d start` elements: no more than front-padding would add (`start` zero queries and
    their outputs, kept for backward), so the mask never costs more memory than the padding."""
    return max(1, q.shape[0] * q.shape[2] * q.shape[3])


def _sdpa(q, k, v, **kwargs) -> torch.Tensor:
    # B T H D -> B H T D for SDPA, and back
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          **kwargs).transpose(1, 2)


def _masked_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Queries at `[start, start + n)` over keys `[0, start + n)` with an explicit additive mask
    `[n, start + n]`: every key before `start` is visible to all of them, the last `n` are causal.
    Work `n (start + n)` scores per head; one query (decoding) needs no mask at all."""
    n, total = q.shape[1], k.shape[1]
    if n == 1:
        return _sdpa(q, k, v)
    # a float mask: SDPA would convert a boolean one into a second [n, start + n] copy
    mask = q.new_zeros((n, total))
    mask[:, start:] = torch.full((n, n), float("-inf"), dtype=q.dtype, device=q.device).triu_(1)
    return _sdpa(q, k, v, attn_mask=mask)


def causal_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """Causal softmax attention of queries at `[start, start + n)` over keys `[0, start + n)`.

    q `[B, n, H, d]`, k/v `[B, start + n, H, d]`, optional additive `bias` `[H, n, start + n]`.
    """
    n, total = q.shape[1], k.shape[1]
    if total != start + n:
        raise ValueError(f"queries at [{start}, {start + n}) need keys [0, {start + n}), got {total}")
    if bias is None and n == 1:
        return _sdpa(q, k, v)  # one query at the end sees every key: no mask (decoding)
    if bias is None and start == 0:
        return _sdpa(q, k, v, is_causal=True)  # square: top-left and bottom-right causal agree
    if bias is None and start > 0 and not q.is_cuda:
        # On the CPU, SDPA's fused kernel is causal only top-left; a bottom-right mask is an
        # explicit [n, start + n] tensor. Two calls, chosen by the shape (docs/architecture.md):
        # - front-padding `start` zero queries makes the call square and top-left causal, fused in
        #   O(start + n) memory, for (start + n)^2 / 2 scores per head, fewer than the mask's
        #   n (start + n) when start < n;
        # - otherwise (few queries over many keys: decoding, prefill chunks, late sequence-parallel
        #   ranks) the mask costs only the n (start + n) scores the math needs, where padding would
        #   cost start^2 / 2 more: O(T^2) for one decoded token. It takes at most `mask_queries`
        #   queries per call, so the mask is never larger than the padding; with autograd on,
        #   every call's mask is kept for backward, so a longer slice (sequence-parallel
        #   training) is padded instead, in linear memory.
        limit = mask_queries(q)
        if start < n or (n > limit and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                    or v.requires_grad)):
            q_pad = torch.cat((q.new_zeros((q.shape[0], start, *q.shape[2:])), q), dim=1)
            return _sdpa(q_pad, k, v, is_causal=True)[:, start:]
        out = [_masked_at(q[:, lo:lo + limit], k[:, :start + lo + limit], v[:, :start + lo + limit], start + lo)
               for lo in range(0, n, limit)]
        return out[0] if len(out) == 1 else torch.cat(out, dim=1)
    if bias is None:
        # j <= i + start: a bottom-right aligned causal mask, which SDPA runs on its fused GPU kernels
        # (an explicit boolean mask falls back to the slower unfused path). Imported here: the module
        # imports torch._dynamo, 2 s of every process's start, and only this GPU path needs it.
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(n, total)
    else:
        i = torch.arange(start, start + n, device=q.device)[:, None]
        j = torch.arange(total, device=q.device)[None, :]
        mask = (bias.to(q.dtype).masked_fill(j > i, float("-inf")))[None]
    return _sdpa(q, k, v, attn_mask=mask)


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


def _window_few_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, *, window: int,
                        rope_theta: float | None) -> torch.Tensor:
    """`window_attention_at` for `n <= window` queries after a halo of `m - n <= window` keys: one
    `[n, m]` banded score tile per head, `O(n (w + n))` work (docs/freesolo.md §1.2's rule, the
    reference's fp32 math)."""
    n, m, dim = q.shape[1], k.shape[1], q.shape[-1]
    halo = m - n
    if rope_theta is not None:
        q, k = rotate(q, rope_theta, start), rotate(k, rope_theta, start - halo)
    acc = torch.promote_types(q.dtype, torch.float32)
    # B T H D -> B H T D
    qh, kh, vh = (x.transpose(1, 2).to(acc) for x in (q, k, v))
    logits = torch.matmul(qh, kh.transpose(-1, -2)) * (1.0 / math.sqrt(dim))
    if n > 1:  # one query over at most `window` earlier keys reads them all: no band to mask
        i = torch.arange(halo, m, device=q.device)[:, None]
        j = torch.arange(m, device=q.device)[None, :]
        logits = logits.masked_fill(~((i - j >= 0) & (i - j <= window)), float("-inf"))
    return torch.matmul(torch.softmax(logits, dim=-1), vh).transpose(1, 2).to(q.dtype)


def window_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, *, window: int,
                        rope_theta: float | None, impl: str = "auto") -> torch.Tensor:
    """Sliding-window attention (`0 <= i - j <= window`, RoPE inside) of queries at
    `[start, start + n)` over keys `[start + n - m, start + n)`.

    q `[B, n, H, d]` unrotated; k/v `[B, m, H, d]` unrotated, `m - n >= min(window, start)`.
    Keys further back than the window are dropped. At most `window` queries (decoding, a
    FreeSolo cache's query block) are computed directly, `O(n (w + n))` scores; more (training,
    a sequence-parallel halo, long prefill chunks) go to `sliding_window_attention` (the Triton
    kernel on CUDA), which takes equal-length q/k/v: the halo positions get zero queries whose
    outputs are dropped (extra work bounded by the window). An explicit `impl="triton"` always
    takes the kernel's path.
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
    if n <= window and impl != "triton":
        # padding would cost (halo + n) queries x (window + 1) keys: O(w^2) for one decoded token
        return _window_few_queries(q, k, v, start, window=window, rope_theta=rope_theta)
    q_pad = torch.cat((q.new_zeros((q.shape[0], halo, *q.shape[2:])), q), dim=1)
    out = sliding_window_attention(q_pad, k, v, window=window, rope_theta=rope_theta, start_pos=start - halo,
                                   impl=impl)
    return out[:, halo:]
