"""The GRC cell of one tree level in Triton, forward and backward (docs/argrc.md §3).

For `M` pairs `(a, b)` of width `D` (all pairs of a level, every sequence of the batch):

    z = [a; b] W1^T + b1                 [M, 4D]   matmul, the pair gathered in the K loop from
                                                   the level itself (strided views, no copy)
    y = GELU(z) W2^T + b2                [M, 4D]   matmul
    [g_a, g_b, g_c, c] = y,  u = s(g_a) a + s(g_b) b + s(g_c) c,  m = LN(u) w + beta

Three kernel launches: the first matmul (GELU in its epilogue), the second matmul, and a row
kernel for the gates and the LayerNorm (a LayerNorm needs whole rows of `D`); a post-merge
network `m + fc2(GELU(fc1 m))` adds two matmul launches. The `4D`-wide activations are
transient: the backward recomputes them from `a` and `b`.

Backward, with `xh = (u - mean) * rstd`:

    du  = rstd (dm w - mean(dm w) - xh mean(dm w xh))
    dg_a = du a s'(g_a), dg_b = du b s'(g_b), dg_c = du c s'(g_c), dc = du s(g_c)
    dz = (dy W2) * GELU'(z),  [da; db] = dz W1 + [du s(g_a); du s(g_b)]
    dW2 = dy^T GELU(z), dW1 = dz^T [a; b], db2 = sum dy, db1 = sum dz, dw = sum dm xh, dbeta = sum dm

Legend: M rows (pairs), D width, H = 4D hidden width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fsf_kernels.common.utils import dot_args


# epilogues of the matmul kernel
PLAIN, GELU, GELU_GRAD = 0, 1, 2


@triton.jit
def matmul_kernel(a_ptr, a2_ptr, b_ptr, c_ptr, bias_ptr, z_ptr, pre_ptr,
                   M, N, K, K_SPLIT, ROWS, stride_ab, stride_a2b,
                   stride_am, stride_ak, stride_a2m, stride_a2k, stride_bk, stride_bn, stride_cm, stride_cn,
                   HAS_BIAS: tl.constexpr, PAIR: tl.constexpr, EPILOGUE: tl.constexpr, STORE_PRE: tl.constexpr,
                   DT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = epilogue(A B + bias). PAIR: columns k < K_SPLIT of A come from `a_ptr`, the rest from
    `a2_ptr` (the pair [a; b] gathered without a copy). EPILOGUE GELU: C = GELU(acc), and the
    pre-activation to `pre_ptr` when STORE_PRE; GELU_GRAD: C = acc * GELU'(z), z read at `z_ptr`."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        row_ok = rm[:, None] < M
        if PAIR:  # the pair [a; b] gathered in the K loop, never copied
            first = kk < K_SPLIT
            batch, index = rm // ROWS, rm % ROWS  # row m of a level view [B, ROWS, D]
            a = tl.load(a_ptr + (batch * stride_ab + index * stride_am)[:, None] + kk[None, :] * stride_ak,
                        mask=row_ok & first[None, :], other=0.0)
            a += tl.load(a2_ptr + (batch * stride_a2b + index * stride_a2m)[:, None] + (kk - K_SPLIT)[None, :] * stride_a2k,
                         mask=row_ok & (~first & (kk < K))[None, :], other=0.0)
        else:
            a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                        mask=row_ok & (kk < K)[None, :], other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(kk < K)[:, None] & (rn < N)[None, :], other=0.0)
        acc += tl.dot(a.to(DT), b.to(DT), input_precision=PREC)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out_mask = (rm < M)[:, None] & (rn < N)[None, :]
    offsets = rm[:, None] * stride_cm + rn[None, :] * stride_cn
    if EPILOGUE == 1:
        if STORE_PRE:
            tl.store(pre_ptr + offsets, acc.to(pre_ptr.dtype.element_ty), mask=out_mask)
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    if EPILOGUE == 2:
        z = tl.load(z_ptr + offsets, mask=out_mask, other=0.0).to(tl.float32)
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        pdf = 0.3989422804014327 * tl.exp(-0.5 * z * z)
        acc = acc * (cdf + z * pdf)
    tl.store(c_ptr + offsets, acc.to(c_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def gates_ln_fwd_kernel(a_ptr, b_ptr, y_ptr, w_ptr, beta_ptr, m_ptr, M, D, eps,
                        ROWS, stride_ab, stride_am, stride_bb, stride_bm,
                        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    mask = (rm < M)[:, None] & (rd < D)[None, :]
    row = rm[:, None] * D + rd[None, :]
    yrow = rm[:, None] * (4 * D) + rd[None, :]
    batch, index = rm // ROWS, rm % ROWS  # a, b: rows of level views [B, ROWS, D]
    a = tl.load(a_ptr + (batch * stride_ab + index * stride_am)[:, None] + rd[None, :], mask=mask,
                other=0.0).to(tl.float32)
    b = tl.load(b_ptr + (batch * stride_bb + index * stride_bm)[:, None] + rd[None, :], mask=mask,
                other=0.0).to(tl.float32)
    g_a = tl.load(y_ptr + yrow, mask=mask, other=0.0).to(tl.float32)
    g_b = tl.load(y_ptr + yrow + D, mask=mask, other=0.0).to(tl.float32)
    g_c = tl.load(y_ptr + yrow + 2 * D, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(y_ptr + yrow + 3 * D, mask=mask, other=0.0).to(tl.float32)
    u = tl.sigmoid(g_a) * a + tl.sigmoid(g_b) * b + tl.sigmoid(g_c) * c
    mean = tl.sum(u, axis=1) / D
    diff = tl.where(mask, u - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / D + eps)
    w = tl.load(w_ptr + rd, mask=rd < D, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rd, mask=rd < D, other=0.0).to(tl.float32)
    m = diff * rstd[:, None] * w[None, :] + beta[None, :]
    tl.store(m_ptr + row, m.to(m_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gates_ln_bwd_kernel(a_ptr, b_ptr, y_ptr, w_ptr, dm_ptr, dy_ptr, dab_ptr, xh_ptr, M, D, eps,
                        ROWS, stride_ab, stride_am, stride_bb, stride_bm,
                        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """dy [M, 4D] (gate and candidate gradients), dab [M, 2D] (the direct gradients of a and b),
    xh [M, D] fp32 (the normalised u, for the LayerNorm weight gradient)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    mask = (rm < M)[:, None] & (rd < D)[None, :]
    row = rm[:, None] * D + rd[None, :]
    yrow = rm[:, None] * (4 * D) + rd[None, :]
    abrow = rm[:, None] * (2 * D) + rd[None, :]
    batch, index = rm // ROWS, rm % ROWS  # a, b: rows of level views [B, ROWS, D]
    a = tl.load(a_ptr + (batch * stride_ab + index * stride_am)[:, None] + rd[None, :], mask=mask,
                other=0.0).to(tl.float32)
    b = tl.load(b_ptr + (batch * stride_bb + index * stride_bm)[:, None] + rd[None, :], mask=mask,
                other=0.0).to(tl.float32)
    s_a = tl.sigmoid(tl.load(y_ptr + yrow, mask=mask, other=0.0).to(tl.float32))
    s_b = tl.sigmoid(tl.load(y_ptr + yrow + D, mask=mask, other=0.0).to(tl.float32))
    s_c = tl.sigmoid(tl.load(y_ptr + yrow + 2 * D, mask=mask, other=0.0).to(tl.float32))
    c = tl.load(y_ptr + yrow + 3 * D, mask=mask, other=0.0).to(tl.float32)
    u = s_a * a + s_b * b + s_c * c
    mean = tl.sum(u, axis=1) / D
    diff = tl.where(mask, u - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / D + eps)
    xh = diff * rstd[:, None]
    w = tl.load(w_ptr + rd, mask=rd < D, other=0.0).to(tl.float32)
    dm = tl.load(dm_ptr + row, mask=mask, other=0.0).to(tl.float32)
    dxh = dm * w[None, :]
    du = rstd[:, None] * (dxh - (tl.sum(dxh, axis=1) / D)[:, None] - xh * (tl.sum(dxh * xh, axis=1) / D)[:, None])
    du = tl.where(mask, du, 0.0)
    tl.store(dy_ptr + yrow, (du * a * s_a * (1.0 - s_a)).to(dy_ptr.dtype.element_ty), mask=mask)
    tl.store(dy_ptr + yrow + D, (du * b * s_b * (1.0 - s_b)).to(dy_ptr.dtype.element_ty), mask=mask)
    tl.store(dy_ptr + yrow + 2 * D, (du * c * s_c * (1.0 - s_c)).to(dy_ptr.dtype.element_ty), mask=mask)
    tl.store(dy_ptr + yrow + 3 * D, (du * s_c).to(dy_ptr.dtype.element_ty), mask=mask)
    tl.store(dab_ptr + abrow, du * s_a, mask=mask)
    tl.store(dab_ptr + abrow + D, du * s_b, mask=mask)
    tl.store(xh_ptr + row, xh, mask=mask)


BLOCK_M, BLOCK_N, BLOCK_K = 32, 64, 32
ROW_BLOCK = 4  # rows per program of the gates/LayerNorm kernels (a row spans the whole D)


def _level_view(x: torch.Tensor) -> tuple[int, int, int]:
    """(rows per batch, batch stride, row stride) of `[M, D]` or of a level view `[B, rows, D]`
    (e.g. every other position of a level), whose last axis must be contiguous."""
    if x.stride(-1) != 1:
        raise ValueError("the pair operands must be contiguous along D")
    if x.dim() == 2:
        return max(x.shape[0], 1), 0, x.stride(0)
    return max(x.shape[1], 1), x.stride(0), x.stride(1)


def _matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, bias=None, pair: torch.Tensor | None = None,
            epilogue: int = PLAIN, z: torch.Tensor | None = None, pre: torch.Tensor | None = None) -> torch.Tensor:
    """out [M, N] = epilogue(A B + bias), A = a [M, K] (or [a, pair] along K, both `[M, D]` or
    level views `[B, rows, D]`, read in place), b [K, N] with any strides."""
    m = out.shape[0]
    k_split = a.shape[-1]
    k = k_split + (pair.shape[-1] if pair is not None else 0)
    n = b.shape[1]
    a2 = pair if pair is not None else a
    rows, stride_ab, stride_am = _level_view(a) if pair is not None else (max(m, 1), 0, a.stride(0))
    _, stride_a2b, stride_a2m = _level_view(a2) if pair is not None else (0, 0, a.stride(0))
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    matmul_kernel[grid](a, a2, b, out, bias if bias is not None else out, z if z is not None else out,
                        pre if pre is not None else out, m, n, k, k_split, rows, stride_ab, stride_a2b,
                        stride_am, a.stride(-1), stride_a2m, a2.stride(-1), b.stride(0), b.stride(1),
                        out.stride(0), out.stride(1),
                        HAS_BIAS=bias is not None, PAIR=pair is not None, EPILOGUE=epilogue,
                        STORE_PRE=pre is not None, **dot_args(a.dtype), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                        BLOCK_K=BLOCK_K)
    return out


def _pair_args(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int, int, int]:
    rows, stride_ab, stride_am = _level_view(a)
    _, stride_bb, stride_bm = _level_view(b)
    return rows, stride_ab, stride_am, stride_bb, stride_bm


def cell_params(cell, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(W1, b1, W2, b2, ln weight, ln bias[, fc1 W, fc1 b, fc2 W, fc2 b]) of a GRC cell module
    (the last four: its post-merge network, when it has one), in the activations' dtype."""
    params = [cell.w1.weight, cell.w1.bias, cell.w2.weight, cell.w2.bias, cell.norm.weight, cell.norm.bias]
    if cell.post is not None:
        params += [cell.post.fc1.weight, cell.post.fc1.bias, cell.post.fc2.weight, cell.post.fc2.bias]
    return tuple(p.to(dtype) for p in params)


def _hidden(a, b, w1, b1, w2, b2, keep_pre: bool):
    d = a.shape[-1]
    m = a.numel() // d
    g = torch.empty((m, 4 * d), device=a.device, dtype=a.dtype)
    z = torch.empty_like(g) if keep_pre else None
    _matmul(a, w1.t(), g, bias=b1, pair=b, epilogue=GELU, pre=z)
    y = torch.empty_like(g)
    _matmul(g, w2.t(), y, bias=b2)
    return y, g, z


def _merge(a, b, y, ln_w, ln_b, eps: float) -> torch.Tensor:
    """m = LayerNorm(gated sum) `[M, D]` from the pair and `y`."""
    d = a.shape[-1]
    m = a.numel() // d
    out = torch.empty((m, d), device=a.device, dtype=a.dtype)
    gates_ln_fwd_kernel[(triton.cdiv(m, ROW_BLOCK),)](a, b, y, ln_w, ln_b, out, m, d, eps, *_pair_args(a, b),
                                                      BLOCK_M=ROW_BLOCK, BLOCK_D=triton.next_power_of_2(d))
    return out


def _post_hidden(merged, fc1_w, fc1_b, keep_pre: bool):
    """GELU(m fc1^T + b) of the post-merge network (and its pre-activation when asked)."""
    h = torch.empty((merged.shape[0], fc1_w.shape[0]), device=merged.device, dtype=merged.dtype)
    pre = torch.empty_like(h) if keep_pre else None
    _matmul(merged, fc1_w.t(), h, bias=fc1_b, epilogue=GELU, pre=pre)
    return h, pre


def grc_cell_fwd(a: torch.Tensor, b: torch.Tensor, params, eps: float) -> torch.Tensor:
    """op(a, b) `[M, D]` for `a, b` `[M, D]` or level views `[B, rows, D]` (read in place:
    e.g. the even and odd positions of a level), rows in batch-major order."""
    w1, b1, w2, b2, ln_w, ln_b = params[:6]
    y, _, _ = _hidden(a, b, w1, b1, w2, b2, keep_pre=False)
    merged = _merge(a, b, y, ln_w, ln_b, eps)
    if len(params) == 6:
        return merged
    fc1_w, fc1_b, fc2_w, fc2_b = params[6:]
    h, _ = _post_hidden(merged, fc1_w, fc1_b, keep_pre=False)
    out = torch.empty_like(merged)
    _matmul(h, fc2_w.t(), out, bias=fc2_b)
    return out + merged  # residual post-merge network


def _post_bwd(merged, dout, fc1_w, fc1_b, fc2_w):
    """(d merged in fp32, [dfc1 W, dfc1 b, dfc2 W, dfc2 b]) through `m + fc2(GELU(fc1 m))`."""
    h, pre = _post_hidden(merged, fc1_w, fc1_b, keep_pre=True)
    dpre = torch.empty_like(h)
    _matmul(dout, fc2_w, dpre, epilogue=GELU_GRAD, z=pre)  # (dout fc2) * GELU'(pre)
    dmerged = torch.empty(merged.shape, device=merged.device, dtype=torch.float32)
    _matmul(dpre, fc1_w, dmerged)
    dmerged += dout.float()
    dfc2 = torch.empty(fc2_w.shape, device=merged.device, dtype=torch.float32)
    _matmul(dout.t(), h, dfc2)
    dfc1 = torch.empty(fc1_w.shape, device=merged.device, dtype=torch.float32)
    _matmul(dpre.t(), merged, dfc1)
    return dmerged, [dfc1, dpre.float().sum(0), dfc2, dout.float().sum(0)]


def grc_cell_bwd(a: torch.Tensor, b: torch.Tensor, dm: torch.Tensor, params, eps: float):
    """(da, db, parameter gradients in the order of `cell_params`, fp32) for `out = op(a, b)`
    and its gradient `dm`; the `4D` activations (and the post-merge hidden ones) recomputed."""
    w1, b1, w2, b2, ln_w, ln_b = params[:6]
    d = a.shape[-1]
    m = a.numel() // d
    y, g, z = _hidden(a, b, w1, b1, w2, b2, keep_pre=True)
    dm = dm.reshape(m, d).contiguous()
    post_grads = []
    if len(params) > 6:
        dm, post_grads = _post_bwd(_merge(a, b, y, ln_w, ln_b, eps), dm, params[6], params[7], params[8])
    dy = torch.empty_like(y)
    dab = torch.empty((m, 2 * d), device=a.device, dtype=torch.float32)
    xh = torch.empty((m, d), device=a.device, dtype=torch.float32)
    gates_ln_bwd_kernel[(triton.cdiv(m, ROW_BLOCK),)](a, b, y, ln_w, dm, dy, dab, xh, m, d, eps, *_pair_args(a, b),
                                                      BLOCK_M=ROW_BLOCK, BLOCK_D=triton.next_power_of_2(d))
    dz = torch.empty_like(y)
    _matmul(dy, w2, dz, epilogue=GELU_GRAD, z=z)  # (dy W2) * GELU'(z)
    dx = torch.empty((m, 2 * d), device=a.device, dtype=torch.float32)
    _matmul(dz, w1, dx)
    dx += dab
    dw2 = torch.empty((4 * d, 4 * d), device=a.device, dtype=torch.float32)
    _matmul(dy.t(), g, dw2)
    dw1 = torch.empty((4 * d, 2 * d), device=a.device, dtype=torch.float32)
    x = torch.cat((a.reshape(m, d), b.reshape(m, d)), dim=1)  # the one copy of the pair, for dW1
    _matmul(dz.t(), x, dw1)
    dmf = dm.float()
    grads = [dw1, dz.float().sum(0), dw2, dy.float().sum(0), (dmf * xh).sum(0), dmf.sum(0), *post_grads]
    return dx[:, :d].to(a.dtype).view(a.shape), dx[:, d:].to(b.dtype).view(b.shape), grads


def accumulating_backward(params, eps: float):
    """(cell_backward, param_grads) for a tree's backward: `cell_backward(a, b, dm)` -> (da, db) in fp32
    for one level's pairs, adding that level's parameter gradients into `param_grads` (fp32, one per
    parameter) as it goes."""
    param_grads = [torch.zeros(p.shape, device=p.device, dtype=torch.float32) for p in params]

    def cell_backward(a, b, dm):
        da, db, grads = grc_cell_bwd(a, b, dm.to(a.dtype), params, eps)
        for total, g in zip(param_grads, grads):
            total += g
        return da.view(a.shape).float(), db.view(b.shape).float()

    return cell_backward, param_grads
