"""Runway-rewired causal attention (docs/rewired.md) in Triton, FlashAttention-2 style.

Each program holds a tile of query rows and streams key tiles: beside the `Q K^T`
tile it computes the bias tile `tau = R U^T` (R the runway rows of the queries,
`r_t` or `r_t^T Bmat`, U the runway head's values of the keys), adds
`-softplus(tau)` where `t - m >= 2`, masks `m > t`, and runs the online softmax;
the forward saves the log-sum-exp. The backward recomputes the probabilities from
it: one pass per key tile gives dK, dV and the key side of the bias gradient
(`dU += dTau^T R`), one pass per query tile gives dQ and the row side
(`dR += dTau U`), with `dTau = dS * (-sigmoid(tau))` on the biased entries
(docs/rewired.md §3). The bias is shared by all heads but programs run per head,
so dU and dR are written per head and summed on the host in a fixed order: no
atomics, deterministic.

Packed documents (`positions`, whole rows: q_start 0, n = T): each query reads only the keys
of its own document. The kernels take `first` `[B, T]` (int32, where each token's document
starts, `t - positions`) and the dK/dV/dU pass `stop` (where it ends, exclusive), both
computed once by the wrapper, behind the constexpr `DOCS`, so the variant without documents
compiles as before (`first`, `stop` None: no arguments at all). A query tile starts its keys
at its earliest document start and a key tile stops its queries at the end of its last key's
document, so the work follows the documents' lengths, not the row's: one launch per kernel
however many documents a row holds. The runway rows `r` come per document from the op
(`fsframework.ops.rewired.rewired_rows`), so the bias needs nothing more: `m = t - 1` and
`m = t` stay exempt, and `t - 1` is another document's key only at a document's first token,
where the mask removes it.

Legend: B batch, n queries at positions [q_start, q_start + n), T = q_start + n keys,
H heads, D head dim. q, o `[B, n, H, D]`; k, v `[B, T, H, D]`; r `[B, n, D]`;
u `[B, T, D]`; the log-sum-exp `lse` and `delta` are fp32 `[B, H, n]`, in base 2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fsf_kernels.common.args import check_document_positions, check_head_dim
from fsf_kernels.common.softmax_bwd import softmax_bwd_delta
from fsf_kernels.common.support import device_target, padded_dim
from fsf_kernels.common.targets import launch, ptr
from fsf_kernels.common.utils import dot_args

_LOG2E = 1.4426950408889634
_TILE = 64  # query and key tile rows; halved for wide fp32 rows, see `tiles`


@triton.jit
def _softplus(x):
    # log(1 + e^x) without overflow
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _rewired_logits(a, b, ra, ub, diff, qk_scale, PREC: tl.constexpr):
    """Base-2 logits `a b^T * qk_scale` with the runway bias `-softplus(tau)`, `tau = ra ub^T`,
    where `diff = t - m >= 2` (the forward's `[BM, BN]` tiles, or the key-major `[BN, BM]` ones).
    Returns (logits, tau, biased)."""
    s = tl.dot(a, tl.trans(b), input_precision=PREC) * qk_scale
    tau = tl.dot(ra, tl.trans(ub), input_precision=PREC)
    biased = diff >= 2
    s = s - tl.where(biased, _softplus(tau), 0.0) * 1.4426950408889634  # log2(e): the logits are base 2
    return s, tau, biased


@triton.jit
def rewired_fwd_kernel(
    q, k, v, r, u, o, lse, first,
    n, T, H, q_start, qk_scale,
    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    DOCS: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    m0 = pid_m * BM
    o_m = m0 + tl.arange(0, BM)
    t = q_start + o_m  # absolute query positions
    m_m = o_m < n
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    row_mask = m_m[:, None] & m_d[None, :]
    rows = b * n + o_m.to(tl.int64)[:, None]
    b_q = tl.load(q + (rows * H + h) * D + o_d[None, :], mask=row_mask, other=0.0).to(DT)
    b_r = tl.load(r + rows * D + o_d[None, :], mask=row_mask, other=0.0).to(DT)

    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    hi = tl.minimum(q_start + m0 + BM, T)  # keys up to the tile's last query
    lo = 0
    if DOCS:  # q_start = 0: query rows are row positions
        b_first = tl.load(first + b * T + o_m, mask=m_m, other=0)
        # documents are runs, so the tile's first query has the earliest document start (clamped:
        # positions are not checked on the GPU, and a bad one must not read before the row)
        lo = tl.maximum(tl.load(first + b * T + m0), 0) // BN * BN
    for n0 in range(lo, hi, BN):
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < T
        cols = b * T + o_n.to(tl.int64)[:, None]
        col_mask = m_n[:, None] & m_d[None, :]
        b_k = tl.load(k + (cols * H + h) * D + o_d[None, :], mask=col_mask, other=0.0).to(DT)
        b_v = tl.load(v + (cols * H + h) * D + o_d[None, :], mask=col_mask, other=0.0).to(DT)
        b_u = tl.load(u + cols * D + o_d[None, :], mask=col_mask, other=0.0).to(DT)
        diff = t[:, None] - o_n[None, :]
        s, _, _ = _rewired_logits(b_q, b_k, b_r, b_u, diff, qk_scale, PREC)
        keep = (diff >= 0) & m_n[None, :]
        if DOCS:
            keep = keep & (o_n[None, :] >= b_first[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), b_v, input_precision=PREC)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(o + (rows * H + h) * D + o_d[None, :], (acc / l_safe[:, None]).to(o.dtype.element_ty), mask=row_mask)
    tl.store(lse + (b * H + h) * n + o_m, m_i + tl.log2(l_safe), mask=m_m)


@triton.jit
def rewired_bwd_dkdvdu_kernel(
    q, k, v, r, u, do, lse, delta, dk, dv, du_h, first, stop,
    n, T, H, q_start, qk_scale, scale,
    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    DOCS: tl.constexpr,
):
    """One key tile of one head, over the query tiles that can see it: dK, dV and this head's dU (with
    documents, a query reads a key only from its own document: `first[query] <= key`)."""
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    n0 = pid_n * BN
    o_n = n0 + tl.arange(0, BN)
    m_n = o_n < T
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    cols = b * T + o_n.to(tl.int64)[:, None]
    col_mask = m_n[:, None] & m_d[None, :]
    kv_off = (cols * H + h) * D + o_d[None, :]
    b_k = tl.load(k + kv_off, mask=col_mask, other=0.0).to(DT)
    b_v = tl.load(v + kv_off, mask=col_mask, other=0.0).to(DT)
    b_u = tl.load(u + cols * D + o_d[None, :], mask=col_mask, other=0.0).to(DT)
    b_dk = tl.zeros([BN, BD], tl.float32)
    b_dv = tl.zeros([BN, BD], tl.float32)
    b_du = tl.zeros([BN, BD], tl.float32)
    lo = tl.maximum(n0 - q_start, 0) // BM * BM  # the first query tile that reaches key n0
    q_hi = n
    if DOCS:
        # queries from the end of the tile's last key's document on read none of its keys
        q_hi = tl.minimum(tl.load(stop + b * T + tl.minimum(n0 + BN, T) - 1), n)
    for m0 in range(lo, q_hi, BM):
        o_m = m0 + tl.arange(0, BM)
        m_m = o_m < n
        t = q_start + o_m
        rows = b * n + o_m.to(tl.int64)[:, None]
        row_mask = m_m[:, None] & m_d[None, :]
        q_off = (rows * H + h) * D + o_d[None, :]
        b_q = tl.load(q + q_off, mask=row_mask, other=0.0).to(DT)
        b_do = tl.load(do + q_off, mask=row_mask, other=0.0).to(DT)
        b_r = tl.load(r + rows * D + o_d[None, :], mask=row_mask, other=0.0).to(DT)
        b_lse = tl.load(lse + (b * H + h) * n + o_m, mask=m_m, other=0.0)
        b_delta = tl.load(delta + (b * H + h) * n + o_m, mask=m_m, other=0.0)
        # transposed tiles [BN, BM] so the key-side sums need no transpose back
        diffT = t[None, :] - o_n[:, None]
        sT, tauT, biased = _rewired_logits(b_k, b_q, b_u, b_r, diffT, qk_scale, PREC)
        valid = (diffT >= 0) & m_m[None, :] & m_n[:, None]
        if DOCS:
            q_first = tl.load(first + b * T + o_m, mask=m_m, other=0)
            valid = valid & (q_first[None, :] <= o_n[:, None])
        pT = tl.where(valid, tl.exp2(sT - b_lse[None, :]), 0.0)
        b_dv += tl.dot(pT.to(DT), b_do, input_precision=PREC)
        dpT = tl.dot(b_v, tl.trans(b_do), input_precision=PREC)
        dsT = pT * (dpT - b_delta[None, :])
        b_dk += tl.dot(dsT.to(DT), b_q, input_precision=PREC)
        dtauT = tl.where(biased & valid, -dsT * tl.sigmoid(tauT), 0.0)
        b_du += tl.dot(dtauT.to(DT), b_r, input_precision=PREC)
    tl.store(dk + kv_off, (b_dk * scale).to(dk.dtype.element_ty), mask=col_mask)
    tl.store(dv + kv_off, b_dv.to(dv.dtype.element_ty), mask=col_mask)
    tl.store(du_h + ((b * H + h) * T + o_n.to(tl.int64)[:, None]) * D + o_d[None, :], b_du, mask=col_mask)


@triton.jit
def rewired_bwd_dqdr_kernel(
    q, k, v, r, u, do, lse, delta, dq, dr_h, first,
    n, T, H, q_start, qk_scale, scale,
    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    DOCS: tl.constexpr,
):
    """One query tile of one head, over its causal key tiles and, with documents, of its documents (as
    the forward): dQ and this head's dR."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    m0 = pid_m * BM
    o_m = m0 + tl.arange(0, BM)
    m_m = o_m < n
    t = q_start + o_m
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    rows = b * n + o_m.to(tl.int64)[:, None]
    row_mask = m_m[:, None] & m_d[None, :]
    q_off = (rows * H + h) * D + o_d[None, :]
    b_q = tl.load(q + q_off, mask=row_mask, other=0.0).to(DT)
    b_do = tl.load(do + q_off, mask=row_mask, other=0.0).to(DT)
    b_r = tl.load(r + rows * D + o_d[None, :], mask=row_mask, other=0.0).to(DT)
    b_lse = tl.load(lse + (b * H + h) * n + o_m, mask=m_m, other=0.0)
    b_delta = tl.load(delta + (b * H + h) * n + o_m, mask=m_m, other=0.0)
    b_dq = tl.zeros([BM, BD], tl.float32)
    b_dr = tl.zeros([BM, BD], tl.float32)
    hi = tl.minimum(q_start + m0 + BM, T)
    lo = 0
    if DOCS:
        b_first = tl.load(first + b * T + o_m, mask=m_m, other=0)
        lo = tl.maximum(tl.load(first + b * T + m0), 0) // BN * BN  # as the forward
    for n0 in range(lo, hi, BN):
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < T
        cols = b * T + o_n.to(tl.int64)[:, None]
        col_mask = m_n[:, None] & m_d[None, :]
        b_k = tl.load(k + (cols * H + h) * D + o_d[None, :], mask=col_mask, other=0.0).to(DT)
        b_v = tl.load(v + (cols * H + h) * D + o_d[None, :], mask=col_mask, other=0.0).to(DT)
        b_u = tl.load(u + cols * D + o_d[None, :], mask=col_mask, other=0.0).to(DT)
        diff = t[:, None] - o_n[None, :]
        s, tau, biased = _rewired_logits(b_q, b_k, b_r, b_u, diff, qk_scale, PREC)
        valid = (diff >= 0) & m_n[None, :] & m_m[:, None]
        if DOCS:
            valid = valid & (o_n[None, :] >= b_first[:, None])
        p = tl.where(valid, tl.exp2(s - b_lse[:, None]), 0.0)
        dp = tl.dot(b_do, tl.trans(b_v), input_precision=PREC)
        ds = p * (dp - b_delta[:, None])
        b_dq += tl.dot(ds.to(DT), b_k, input_precision=PREC)
        dtau = tl.where(biased & valid, -ds * tl.sigmoid(tau), 0.0)
        b_dr += tl.dot(dtau.to(DT), b_u, input_precision=PREC)
    tl.store(dq + q_off, b_dq * scale, mask=row_mask)
    tl.store(dr_h + ((b * H + h) * n + o_m.to(tl.int64)[:, None]) * D + o_d[None, :], b_dr, mask=row_mask)


def _row_bytes(dtype: torch.dtype, dim: int) -> int:
    """Bytes of one tile row: the padded head dim in `dtype`."""
    return padded_dim(dim) * dtype.itemsize


def tiles(dtype: torch.dtype, dim: int, arch: int) -> int:
    """Tile rows for a head dim on target `arch`: 64 while a row takes at most 256 bytes, 32 up to
    512 bytes (fp32 at d = 128, half at d = 256), 16 beyond (fp32 at d = 256), which keeps every
    kernel within the shared memory of an sm_80 block; sm_86 (101,376 B) halves each step once more
    (64 up to 128 bytes, 32 up to 256), down to 16 (`python -m fsf_kernels.compile_check --only
    rewired` prints the figures)."""
    width = _row_bytes(dtype, dim) * (2 if arch == 86 else 1)
    return _TILE if width <= 256 else _TILE // 2 if width <= 512 else _TILE // 4


def stages(dtype: torch.dtype, dim: int, arch: int) -> int:
    """Pipeline stages: 3, but 2 on sm_86 for fp32 at d = 256, whose 16-row tiles need 148,736 B
    with 3 there."""
    return 2 if arch == 86 and _row_bytes(dtype, dim) > 512 else 3


def launch_meta(dtype: torch.dtype, dim: int, arch: int, gpu: bool = False) -> dict:
    """Constexprs and the stage count (`num_stages`) of the three kernels on target `arch`."""
    tile = tiles(dtype, dim, arch)
    return dict(D=dim, BD=padded_dim(dim), BM=tile, BN=tile, num_stages=stages(dtype, dim, arch),
                **dot_args(dtype, gpu=gpu))


def document_bounds(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`first` and `stop` `[B, T]` (contiguous int32) of packed documents' positions `[B, T]`: where each
    token's document starts (`t - positions`) and where it ends (exclusive: the next document's start,
    or T), on the positions' device and without reading them back to the host."""
    total = positions.shape[1]
    t = torch.arange(total, device=positions.device)
    first = t - positions
    # a document starts where its position is 0; the end of t's is the first start after t, a suffix
    # minimum of the starts (T past the last)
    starts = torch.where(positions[:, 1:] == 0, t[1:], total)
    after = torch.cat((starts, torch.full_like(positions[:, :1], total)), dim=1)
    stop = after.flip(1).cummin(1).values.flip(1)
    return first.to(torch.int32).contiguous(), stop.to(torch.int32).contiguous()


def rewired_fwd(q, k, v, r, u, q_start: int, first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """o `[B, n, H, D]` in q's dtype and lse `[B, H, n]` (fp32, base 2); inputs contiguous. first: None,
    or `document_bounds`' first (q_start 0): each query reads no key before it."""
    bsz, n, heads, dim = q.shape
    total = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((bsz, heads, n), device=q.device, dtype=torch.float32)
    scale = 1.0 / math.sqrt(dim)
    meta = launch_meta(q.dtype, dim, device_target(q.device))
    rewired_fwd_kernel[(triton.cdiv(n, meta["BM"]), bsz * heads)](
        q, k, v, r, u, o, lse, first, n, total, heads, q_start, scale * _LOG2E, **meta, DOCS=first is not None,
    )
    return o, lse


def rewired_bwd(q, k, v, r, u, o, lse, do, q_start: int, first: torch.Tensor | None = None,
                stop: torch.Tensor | None = None):
    """dq, dk (fp32), dv (v's dtype), dr `[B, n, D]`, du `[B, T, D]` (fp32, summed over heads in order).
    first, stop: None, or `document_bounds` of the forward's documents."""
    bsz, n, heads, dim = q.shape
    total = k.shape[1]
    meta = launch_meta(q.dtype, dim, device_target(q.device))
    tile = meta["BM"]
    scale = 1.0 / math.sqrt(dim)
    delta = softmax_bwd_delta(o, do, tile)
    dq = torch.empty((bsz, n, heads, dim), device=q.device, dtype=torch.float32)
    dk = torch.empty((bsz, total, heads, dim), device=q.device, dtype=torch.float32)
    dv = torch.empty_like(v)
    du_h = torch.empty((bsz, heads, total, dim), device=q.device, dtype=torch.float32)
    dr_h = torch.empty((bsz, heads, n, dim), device=q.device, dtype=torch.float32)
    docs = first is not None
    rewired_bwd_dkdvdu_kernel[(triton.cdiv(total, tile), bsz * heads)](
        q, k, v, r, u, do, lse, delta, dk, dv, du_h, first, stop, n, total, heads, q_start, scale * _LOG2E, scale,
        **meta, DOCS=docs,
    )
    rewired_bwd_dqdr_kernel[(triton.cdiv(n, tile), bsz * heads)](
        q, k, v, r, u, do, lse, delta, dq, dr_h, first, n, total, heads, q_start, scale * _LOG2E, scale, **meta,
        DOCS=docs,
    )
    # the bias is shared by the heads: sum their parts (a fixed order, so deterministic)
    return dq, dk, dv, dr_h.sum(1), du_h.sum(1)


def launches(dtype: torch.dtype, dim: int, arch: int) -> list:
    """The compiled variants a launch on sm_`arch` uses (`fsf_kernels.common.targets`), from the
    launcher's own tiles and stages: each kernel without documents (its bounds None, which Triton
    makes constexprs, as the launch passes them: no arguments at all) and with them (" docs")."""
    meta = launch_meta(dtype, dim, arch, gpu=True)
    opts = dict(floats={"qk_scale", "scale"}, num_stages=meta.pop("num_stages"))
    p, f32 = ptr(dtype), "*fp32"
    kernels = [
        ("rewired fwd", rewired_fwd_kernel, dict(q=p, k=p, v=p, r=p, u=p, o=p, lse=f32), ("first",)),
        ("rewired bwd dk/dv/du", rewired_bwd_dkdvdu_kernel,
         dict(q=p, k=p, v=p, r=p, u=p, do=p, lse=f32, delta=f32, dk=f32, dv=p, du_h=f32), ("first", "stop")),
        ("rewired bwd dq/dr", rewired_bwd_dqdr_kernel,
         dict(q=p, k=p, v=p, r=p, u=p, do=p, lse=f32, delta=f32, dq=f32, dr_h=f32), ("first",)),
    ]
    out = [launch(label, fn, pointers, dict(meta, DOCS=False, **dict.fromkeys(bounds)), **opts)
           for label, fn, pointers, bounds in kernels]
    out += [launch(label + " docs", fn, dict(pointers, **dict.fromkeys(bounds, "*i32")), dict(meta, DOCS=True),
                   **opts) for label, fn, pointers, bounds in kernels]
    return out


class RewiredAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, r, u, q_start, first=None, stop=None):
        q, k, v, r, u = (x.contiguous() for x in (q, k, v, r, u))
        o, lse = rewired_fwd(q, k, v, r, u, q_start, first)
        ctx.save_for_backward(q, k, v, r, u, o, lse, first, stop)
        ctx.q_start = q_start
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, r, u, o, lse, first, stop = ctx.saved_tensors
        dq, dk, dv, dr, du = rewired_bwd(q, k, v, r, u, o, lse, do.contiguous(), ctx.q_start, first, stop)
        return dq.to(q.dtype), dk.to(k.dtype), dv, dr.to(r.dtype), du.to(u.dtype), None, None, None


def rewired_attention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, u: torch.Tensor,
                           q_start: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Runway-rewired attention given the bias rows: the Triton form of
    `fsframework.ops.rewired.rewired_attention_rows` (same tensors, same result).

    q `[B, n, H, D]` and k, v `[B, q_start + n, H, D]` (q, k rotated), one dtype of
    fp32/fp16/bf16; r `[B, n, D]` (`r_t`, or `r_t^T Bmat`) and u `[B, q_start + n, D]`.
    Returns `[B, n, H, D]` in q's dtype.

    positions: None, or an integer `[B, T]` of packed documents (whole rows: q_start 0), each
    token's position inside its document (checked off CUDA only: `check_document_positions`), with
    r the documents' runway rows (`fsframework.ops.rewired.rewired_rows` with the positions): each
    query reads only its document's keys, every document as a row of its own, one launch per kernel.
    """
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or k.shape[0] != q.shape[0] \
            or k.shape[2:] != q.shape[2:] or k.shape[1] != q_start + q.shape[1]:
        raise ValueError(f"with q_start={q_start}, q [B, n, H, D] needs k, v [B, q_start + n, H, D], got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    bsz, n, _, dim = q.shape
    if tuple(r.shape) != (bsz, n, dim) or tuple(u.shape) != (bsz, q_start + n, dim):
        raise ValueError(f"r must be [B, n, D] = {(bsz, n, dim)} and u [B, q_start + n, D] = "
                         f"{(bsz, q_start + n, dim)}, got {tuple(r.shape)} and {tuple(u.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_head_dim("q", q)
    if positions is None:
        return RewiredAttentionFunction.apply(q, k, v, r, u, int(q_start), None, None)
    if q_start != 0:
        raise ValueError(f"positions (packed documents) take whole rows: q_start must be 0, got {q_start}")
    check_document_positions(positions, q)
    # the documents' bounds once, for the forward and both backward kernels
    return RewiredAttentionFunction.apply(q, k, v, r, u, 0, *document_bounds(positions))
