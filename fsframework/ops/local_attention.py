"""Sliding-window causal attention with RoPE (docs/freesolo.md §1.2): the reference, and its fused form.

Query `i` attends to keys `j` with `0 <= i - j <= window` (window + 1 keys, self
included); logits are `RoPE(q_i) . RoPE(k_j) / sqrt(d)`. Queries are processed in
chunks so memory is `O(N * (chunk + window))`, never `N x N`. The reference
(`window_attention_reference`, explicit softmax) is what the Triton kernel is
tested against; `window_attention_sdpa` computes the same through PyTorch's fused
attention and is what `impl="auto"` runs where the kernel does not (the CPU).

Packed documents (`positions`, docs/training.md "Documents"): a row may hold several documents,
each read as a row of its own in the same call: query `i` reads only the keys of its document
(`j >= i - positions[b, i]`, besides the band), and RoPE rotates at the positions inside the
document. The result equals running each document alone (tests/ops/test_local_attention.py).

Shapes: q, k, v `[B, T, H, D]` -> `[B, T, H, D]`; positions `[B, T]` int64.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fsf_kernels.common.args import check_document_positions, check_window_args
from fsf_kernels.common.support import window_unsupported
from fsframework.ops.dispatch import kernel_for
from fsframework.ops.rope import rotate, rotate_at


def _document_firsts(q: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor | None:
    """The row index where each token's document starts, `t - positions[b, t]` `[B, T]` (None without
    documents); checks `positions` (their values only off CUDA)."""
    if positions is None:
        return None
    check_document_positions(positions, q)
    return torch.arange(q.shape[1], device=q.device) - positions


def _banded_chunks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, size: int,
                   first: torch.Tensor | None = None):
    """Query chunks of `size` tokens with the keys and values that cover their band: yields `qc, kc, vc`
    `[B, H, *, D]` in fp32 (fp64 kept for tests) and `band` `[n, m]` (True: query i reads key j); with
    `first` `[B, T]` (where each query's document starts), `band` `[B, 1, n, m]` also keeps each query
    to its document's keys, `j >= first[b, i]`.

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
        band = (qi - kj >= 0) & (qi - kj <= window)
        if first is not None:
            # per row: the documents differ; [B, 1, n, m] broadcasts over heads (no row is empty: a
            # query reads itself)
            band = band & (kj >= first[:, start:start + qc.shape[2], None])[:, None]
        yield qc, kc, vc, band


def window_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, chunk: int = 256,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Banded causal softmax attention on already-rotated q/k, chunked over queries (chunks of
    `max(chunk, window)` tokens, `_banded_chunks`), as an explicit masked softmax. `positions` `[B, T]`
    (each token's position inside its document): each query reads only its own document's keys."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    first = _document_firsts(q, positions)
    outs = []
    for qc, kc, vc, band in _banded_chunks(q, k, v, window=window, size=max(chunk, window), first=first):
        logits = torch.matmul(qc, kc.transpose(-1, -2)) * scale
        probs = torch.softmax(logits.masked_fill(~band, float("-inf")), dim=-1)
        outs.append(torch.matmul(probs, vc))
    return torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype)


def window_attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, chunk: int = 128,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """`window_attention_reference` through PyTorch's fused attention: what `impl="auto"` runs where no
    kernel does (the CPU). Each chunk of `max(chunk, window)` queries reads its band with the band as
    a boolean mask (every query sees itself, so no row is empty). The fused CPU kernel keeps only
    each chunk's output and log-sum-exp for the backward pass, not its probabilities: ~3x faster than
    the reference at the quickstart's shapes, in less memory (`tools/bench_attention.py`). Its
    gradients round differently: with `window=0` the true dq is 0 and this one is rounding noise, so
    the reference, not this, is what kernels are judged by. `positions`: as the reference's (the mask
    then `[B, 1, n, m]`, one per row).
    """
    first = _document_firsts(q, positions)
    outs = [F.scaled_dot_product_attention(qc, kc, vc, attn_mask=band)
            for qc, kc, vc, band in _banded_chunks(q, k, v, window=window, size=max(chunk, window), first=first)]
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
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Local branch of FreeSolo and the SWA baseline.

    q, k, v: `[B, T, H, D]`, q/k unrotated; RoPE (base `rope_theta`, absolute
    positions from `start_pos`) is applied here, or skipped when `rope_theta`
    is None. `impl`: "reference", "triton" or "auto" (Triton on CUDA tensors
    when the kernel is importable and supports the call, `window_attention_sdpa`
    elsewhere).

    positions: None (each row is one sequence), or int64 `[B, T]`, each token's
    position inside its document (0 at a document's start, +1 per token within
    it; every row starts a document). Each document is then read as a row of its
    own, in this one call: its queries read only its keys and RoPE rotates at
    `positions` (`start_pos` must be 0). Checked for that form off CUDA only
    (reading the values there would wait for the device).
    """
    check_window_args(q, k, v, window)
    if positions is not None:
        check_document_positions(positions, q, start_pos)
    kernel = kernel_for("window_attention", "sliding_window_attention", impl, q,
                        window_unsupported(q.dtype, q.shape[-1], rope=rope_theta is not None))
    if kernel is not None:
        # positions only when given: the call without documents stays what it was
        docs = {} if positions is None else {"positions": positions}
        return kernel(q, k, v, window=window, rope_theta=rope_theta, start_pos=start_pos, **docs)
    if rope_theta is not None:
        if positions is None:
            q = rotate(q, rope_theta, start_pos)
            k = rotate(k, rope_theta, start_pos)
        else:
            q = rotate_at(q, rope_theta, positions)
            k = rotate_at(k, rope_theta, positions)
    if impl == "reference":
        return window_attention_reference(q, k, v, window=window, positions=positions)
    return window_attention_sdpa(q, k, v, window=window, positions=positions)  # "auto" without a kernel: the fused form
