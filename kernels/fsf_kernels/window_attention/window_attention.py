"""Sliding-window causal attention with RoPE (docs/freesolo.md §1.2) in Triton.

Query i attends to keys j with 0 <= i - j <= window. FlashAttention-style:
the forward keeps an online softmax per query tile and visits only the key
tiles that intersect the band; the backward recomputes probabilities from the
saved log-sum-exp, with one pass over key tiles for dk/dv and one over query
tiles for dq (no atomics). RoPE is a pre-pass (see common/rope.py).

Packed documents (`positions`): each query reads only the keys of its own document. The
kernels take `first` `[B, T]` (int32, the row index where each token's document starts,
`t - positions`), behind the constexpr `DOCS`, so the variant without documents compiles as
before: one launch per kernel however many documents a row holds.

Legend: B batch, T sequence, H heads, D head dim. Tensors are `[B, T, H, D]`;
the log-sum-exp `lse` and `delta` are fp32 `[B, H, T]` and in base 2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fsf_kernels.common.args import check_document_positions, check_head_dim, check_window_args
from fsf_kernels.common.rope import rope_apply
from fsf_kernels.common.rope_tables import rope_tables, rotate_at
from fsf_kernels.common.softmax_bwd import softmax_bwd_delta
from fsf_kernels.common.support import device_target, padded_dim, window_tiles, window_unsupported
from fsf_kernels.common.targets import launch, ptr
from fsf_kernels.common.utils import dot_args

_LOG2E = 1.4426950408889634


@triton.jit
def window_attention_fwd_kernel(
    q, k, v, o, lse, first,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
    T, H, window, qk_scale,
    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    DOCS: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    m0 = pid_m * BM
    o_m = m0 + tl.arange(0, BM)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    p_q = q + b * s_qb + h * s_qh + o_m.to(tl.int64)[:, None] * s_qt + o_d[None, :]
    b_q = tl.load(p_q, mask=(o_m[:, None] < T) & m_d[None, :], other=0.0).to(DT)

    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    # only key tiles that meet the band [m0 - window, m0 + BM - 1]
    lo = tl.maximum(m0 - window, 0)
    if DOCS:
        b_first = tl.load(first + b * T + o_m, mask=o_m < T, other=0)
        # documents are runs, so the tile's first query has the earliest document start
        lo = tl.maximum(lo, tl.load(first + b * T + m0))
    lo = lo // BN * BN
    hi = tl.minimum(m0 + BM, T)
    for n0 in range(lo, hi, BN):
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < T
        row = o_n.to(tl.int64)[:, None]
        kv_mask = m_n[:, None] & m_d[None, :]
        b_k = tl.load(k + b * s_kb + h * s_kh + row * s_kt + o_d[None, :], mask=kv_mask, other=0.0).to(DT)
        b_v = tl.load(v + b * s_vb + h * s_vh + row * s_vt + o_d[None, :], mask=kv_mask, other=0.0).to(DT)
        s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale
        diff = o_m[:, None] - o_n[None, :]
        band = (diff >= 0) & (diff <= window) & m_n[None, :]
        if DOCS:
            band = band & (o_n[None, :] >= b_first[:, None])
        s = tl.where(band, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row can still be empty (padding rows); keep its exponents finite
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    m_row = o_m < T
    p_o = o + ((b * T + o_m.to(tl.int64)[:, None]) * H + h) * D + o_d[None, :]
    tl.store(p_o, out.to(o.dtype.element_ty), mask=m_row[:, None] & m_d[None, :])
    tl.store(lse + (b * H + h) * T + o_m, m_i + tl.log2(l_safe), mask=m_row)


@triton.jit
def window_attention_bwd_dkdv_kernel(
    q, k, v, do, lse, delta, dk, dv, first,
    T, H, window, qk_scale, scale,
    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    DOCS: tl.constexpr,
):
    """One key tile, looping over the query tiles of [n0, n0 + BN - 1 + window] (with documents, a
    query reads a key only from its own document: `first[query] <= key`)."""
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    n0 = pid_n * BN
    o_n = n0 + tl.arange(0, BN)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_n = o_n < T
    kv_off = ((b * T + o_n.to(tl.int64)[:, None]) * H + h) * D + o_d[None, :]
    kv_mask = m_n[:, None] & m_d[None, :]
    b_k = tl.load(k + kv_off, mask=kv_mask, other=0.0).to(DT)
    b_v = tl.load(v + kv_off, mask=kv_mask, other=0.0).to(DT)
    b_dk = tl.zeros([BN, BD], tl.float32)
    b_dv = tl.zeros([BN, BD], tl.float32)
    lo = n0 // BM * BM
    hi = tl.minimum(n0 + BN + window, T)
    for m0 in range(lo, hi, BM):
        o_m = m0 + tl.arange(0, BM)
        m_m = o_m < T
        q_off = ((b * T + o_m.to(tl.int64)[:, None]) * H + h) * D + o_d[None, :]
        q_mask = m_m[:, None] & m_d[None, :]
        b_q = tl.load(q + q_off, mask=q_mask, other=0.0).to(DT)
        b_do = tl.load(do + q_off, mask=q_mask, other=0.0).to(DT)
        b_lse = tl.load(lse + (b * H + h) * T + o_m, mask=m_m, other=0.0)
        b_delta = tl.load(delta + (b * H + h) * T + o_m, mask=m_m, other=0.0)
        # transposed scores [BN, BM] so dk/dv accumulate without transposing back
        sT = tl.dot(b_k, tl.trans(b_q), input_precision=PREC) * qk_scale
        diff = o_m[None, :] - o_n[:, None]
        band = (diff >= 0) & (diff <= window) & m_m[None, :] & m_n[:, None]
        if DOCS:
            q_first = tl.load(first + b * T + o_m, mask=m_m, other=0)
            band = band & (q_first[None, :] <= o_n[:, None])
        pT = tl.where(band, tl.exp2(sT - b_lse[None, :]), 0.0)
        b_dv += tl.dot(pT.to(b_do.dtype), b_do, input_precision=PREC)
        dpT = tl.dot(b_v, tl.trans(b_do), input_precision=PREC)
        dsT = pT * (dpT - b_delta[None, :])
        b_dk += tl.dot(dsT.to(b_q.dtype), b_q, input_precision=PREC)
    tl.store(dk + kv_off, (b_dk * scale).to(dk.dtype.element_ty), mask=kv_mask)
    tl.store(dv + kv_off, b_dv.to(dv.dtype.element_ty), mask=kv_mask)


@triton.jit
def window_attention_bwd_dq_kernel(
    q, k, v, do, lse, delta, dq, first,
    T, H, window, qk_scale, scale,
    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    DOCS: tl.constexpr,
):
    """One query tile, looping over the key tiles of its band and, with documents, of its
    documents (as the forward)."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    m0 = pid_m * BM
    o_m = m0 + tl.arange(0, BM)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_m = o_m < T
    q_off = ((b * T + o_m.to(tl.int64)[:, None]) * H + h) * D + o_d[None, :]
    q_mask = m_m[:, None] & m_d[None, :]
    b_q = tl.load(q + q_off, mask=q_mask, other=0.0).to(DT)
    b_do = tl.load(do + q_off, mask=q_mask, other=0.0).to(DT)
    b_lse = tl.load(lse + (b * H + h) * T + o_m, mask=m_m, other=0.0)
    b_delta = tl.load(delta + (b * H + h) * T + o_m, mask=m_m, other=0.0)
    b_dq = tl.zeros([BM, BD], tl.float32)
    lo = tl.maximum(m0 - window, 0)
    if DOCS:
        b_first = tl.load(first + b * T + o_m, mask=m_m, other=0)
        lo = tl.maximum(lo, tl.load(first + b * T + m0))  # as the forward
    lo = lo // BN * BN
    hi = tl.minimum(m0 + BM, T)
    for n0 in range(lo, hi, BN):
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < T
        kv_off = ((b * T + o_n.to(tl.int64)[:, None]) * H + h) * D + o_d[None, :]
        kv_mask = m_n[:, None] & m_d[None, :]
        b_k = tl.load(k + kv_off, mask=kv_mask, other=0.0).to(DT)
        b_v = tl.load(v + kv_off, mask=kv_mask, other=0.0).to(DT)
        s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale
        diff = o_m[:, None] - o_n[None, :]
        band = (diff >= 0) & (diff <= window) & m_n[None, :] & m_m[:, None]
        if DOCS:
            band = band & (o_n[None, :] >= b_first[:, None])
        p = tl.where(band, tl.exp2(s - b_lse[:, None]), 0.0)
        dp = tl.dot(b_do, tl.trans(b_v), input_precision=PREC)
        ds = p * (dp - b_delta[:, None])
        b_dq += tl.dot(ds.to(b_k.dtype), b_k, input_precision=PREC)
    tl.store(dq + q_off, b_dq * scale, mask=q_mask)


def _meta(dtype: torch.dtype, dim: int, arch: int, gpu: bool = False) -> tuple[dict, dict]:
    """(constexprs, launch options) of the three kernels: tiles per (head dim, dtype, target),
    `fsf_kernels.common.support.window_tiles`."""
    bm, bn, stages = window_tiles(dtype, dim, arch)
    return dict(D=dim, BD=padded_dim(dim), BM=bm, BN=bn, **dot_args(dtype, gpu=gpu)), dict(num_stages=stages)


def window_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                         first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Banded attention on already-rotated q/k: returns o `[B, T, H, D]` and lse `[B, H, T]`. `first`:
    None, or contiguous int32 `[B, T]`, where each token's document starts (its queries read no key
    before it)."""
    bsz, seq, heads, dim = q.shape
    q, k, v = (x if x.stride(3) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty((bsz, seq, heads, dim), device=q.device, dtype=q.dtype)
    lse = torch.empty((bsz, heads, seq), device=q.device, dtype=torch.float32)
    scale = 1.0 / math.sqrt(dim)
    meta, opts = _meta(q.dtype, dim, device_target(q.device))
    grid = (triton.cdiv(seq, meta["BM"]), bsz * heads)
    window_attention_fwd_kernel[grid](
        q, k, v, o, lse, first,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        seq, heads, window, scale * _LOG2E, **meta, DOCS=first is not None, **opts,
    )
    return o, lse


def window_attention_bwd(q, k, v, o, lse, do, window: int,
                         first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. the rotated q/k (fp32) and v (v's dtype); all contiguous. `first`: as the
    forward's."""
    bsz, seq, heads, dim = q.shape
    q, k, v, o, do = (x.contiguous() for x in (q, k, v, o, do))
    scale = 1.0 / math.sqrt(dim)
    meta, opts = _meta(q.dtype, dim, device_target(q.device))
    delta = softmax_bwd_delta(o, do, meta["BM"])
    dq = torch.empty((bsz, seq, heads, dim), device=q.device, dtype=torch.float32)
    dk = torch.empty((bsz, seq, heads, dim), device=q.device, dtype=torch.float32)
    dv = torch.empty_like(v)
    docs = first is not None
    window_attention_bwd_dkdv_kernel[(triton.cdiv(seq, meta["BN"]), bsz * heads)](
        q, k, v, do, lse, delta, dk, dv, first, seq, heads, window, scale * _LOG2E, scale, **meta, DOCS=docs,
        **opts
    )
    window_attention_bwd_dq_kernel[(triton.cdiv(seq, meta["BM"]), bsz * heads)](
        q, k, v, do, lse, delta, dq, first, seq, heads, window, scale * _LOG2E, scale, **meta, DOCS=docs, **opts
    )
    return dq, dk, dv


def launches(dtype: torch.dtype, dim: int, arch: int) -> list:
    """The compiled variants a launch on sm_`arch` uses (`fsf_kernels.common.targets`): each kernel
    without documents (`first` None, a constexpr as the launch makes it) and with them (" docs")."""
    meta, opts = _meta(dtype, dim, arch, gpu=True)
    p, f32 = ptr(dtype), "*fp32"
    scales = {"qk_scale", "scale"}
    out = []
    for docs in (False, True):
        # without documents `first` is None, which Triton makes a constexpr: no argument at all
        firsts, consts = (dict(first="*i32"), {}) if docs else ({}, dict(first=None))
        tail, flags = (" docs" if docs else ""), dict(meta, DOCS=docs, **consts)
        out += [
            launch("window fwd" + tail, window_attention_fwd_kernel, dict(q=p, k=p, v=p, o=p, lse=f32, **firsts),
                   flags, floats=scales, **opts),
            launch("window bwd dk/dv" + tail, window_attention_bwd_dkdv_kernel,
                   dict(q=p, k=p, v=p, do=p, lse=f32, delta=f32, dk=f32, dv=p, **firsts), flags, floats=scales,
                   **opts),
            launch("window bwd dq" + tail, window_attention_bwd_dq_kernel,
                   dict(q=p, k=p, v=p, do=p, lse=f32, delta=f32, dq=f32, **firsts), flags, floats=scales, **opts),
        ]
    return out


class WindowAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, window, cos, sin, first=None):
        q_r = q if cos is None else rope_apply(q, cos, sin)
        k_r = k if cos is None else rope_apply(k, cos, sin)
        o, lse = window_attention_fwd(q_r, k_r, v, window, first)
        ctx.save_for_backward(q_r, k_r, v, o, lse, cos, sin, first)
        ctx.window = window
        ctx.dtypes = (q.dtype, k.dtype)
        return o

    @staticmethod
    def backward(ctx, do):
        q_r, k_r, v, o, lse, cos, sin, first = ctx.saved_tensors
        dq, dk, dv = window_attention_bwd(q_r, k_r, v, o, lse, do, ctx.window, first)
        if cos is not None:
            # d(R x)/dx = R, so the input gradient is R^T applied to the rotated one
            dq = rope_apply(dq, cos, sin, inverse=True, out_dtype=ctx.dtypes[0])
            dk = rope_apply(dk, cos, sin, inverse=True, out_dtype=ctx.dtypes[1])
        else:
            dq, dk = dq.to(ctx.dtypes[0]), dk.to(ctx.dtypes[1])
        return dq, dk, dv, None, None, None, None


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window: int,
    rope_theta: float | None = 10000.0,
    start_pos: int = 0,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sliding-window causal attention with RoPE, Triton forward and backward.

    q, k, v: `[B, T, H, D]`, q/k unrotated, fp32/fp16/bf16, one dtype, on the
    same device. Query i attends to keys j with `0 <= i - j <= window`, logits
    `RoPE(q_i) . RoPE(k_j) / sqrt(D)`; RoPE (half-split, base `rope_theta`,
    positions from `start_pos`) is skipped when `rope_theta` is None.
    Returns `[B, T, H, D]` in q's dtype. Same result as
    `fsframework.ops.local_attention.sliding_window_attention(impl="reference")`.

    positions: None, or int64 `[B, T]`, each token's position inside its
    document (packed documents: 0 at a document's start, +1 per token within
    it; `start_pos` must be 0). Query i then also reads only keys
    `j >= i - positions[b, i]` (its own document), and RoPE rotates at
    `positions` (`fsf_kernels.common.rope_tables.rotate_at`, before the kernels, which run
    with rope off; autograd carries the gradients back through it): every
    document as a row of its own, one launch per kernel for all of them. The
    values are checked off CUDA only (reading them there would wait for the
    device).
    """
    check_window_args(q, k, v, window)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_head_dim("q", q, even=rope_theta is not None)
    reason = window_unsupported(q.dtype, q.shape[-1], rope=rope_theta is not None)
    if reason:
        raise ValueError(f"the Triton window-attention kernel does not support this call: {reason}")
    if start_pos < 0:
        raise ValueError(f"start_pos must be >= 0, got {start_pos}")
    if positions is not None:
        check_document_positions(positions, q, start_pos)
        # where each token's document starts, once for the three kernels (int32: a row index)
        first = (torch.arange(q.shape[1], device=q.device) - positions).to(torch.int32).contiguous()
        if rope_theta is not None:
            # the reference's own rotation at the positions (the pre-pass kernel rotates consecutive
            # positions only)
            q, k = rotate_at(q, rope_theta, positions), rotate_at(k, rope_theta, positions)
        return WindowAttentionFunction.apply(q, k, v, int(window), None, None, first)
    cos = sin = None
    if rope_theta is not None:
        cos, sin = rope_tables(q.shape[1], q.shape[3], rope_theta, start_pos, q.device)
    return WindowAttentionFunction.apply(q, k, v, int(window), cos, sin, None)
