"""FreeSolo selected-cell readout (docs/freesolo.md §1.6, Eq. 9) in Triton, forward and backward.

Work is grouped by cell: a program owns a tile of BM queries of one head and
walks the sorted, de-duplicated list of cells that any of them selected
(`unique_cells`, one launch of `unique_cells_kernel` for all the lists). Each
cell's K/V tile is loaded once and serves every query of the tile that chose
it (rows that did not are masked), with an online softmax in registers.

The backward's dq walks the same lists, accumulating in registers. dk/dv are
grouped the other way round (`dkdv="by_cell"`, the default): the selections
are sorted by cell once (`selections_by_cell`), and a program owns one cell of
one head, walks the queries that chose it in chunks and accumulates the cell's
dk/dv in registers, written once: no atomics, the same result on every run.
`dkdv="atomic"`, the first design, adds each tile's `[S, D]` share of a cell's
dk/dv atomically into fp32 buffers instead (docs/kernels.md has both timed).
RMSNorm is fused into the forward epilogue and its backward into a row pre-pass.

Legend: B batch, N tokens, H heads, D head dim, S cell size, K cells per
query, NT = ceil(N / BM) query tiles, U = BM * K list slots per tile
(UP = U rounded up to a power of two).
Row statistics (lse in base 2, rstd, delta) are fp32 `[B, H, N]`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fsf_kernels.common.args import check_head_dim, check_readout_args
from fsf_kernels.common.support import (device_target, padded_dim, readout_by_cell_tiles, readout_stages,
                                        readout_unsupported)
from fsf_kernels.common.targets import launch, ptr
from fsf_kernels.common.utils import dot_args, next_pow2

_LOG2E = 1.4426950408889634
_BM = 16
_NONE = 2147483647  # sorts after every cell id
_NONE_JIT = tl.constexpr(_NONE)  # the same, for the kernels (a plain global is refused inside @triton.jit)
DKDV = ("by_cell", "atomic")


@triton.jit
def cell_readout_fwd_kernel(
    q, k, v, cells, ucells, ucount, g, out, y, lse, rstd,
    s_gh, n, T, H, NT, eps, qk_scale,
    S: tl.constexpr, SP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BM: tl.constexpr, HAS_G: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    pid_t, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    o_m = pid_t * BM + tl.arange(0, BM)
    m_row = o_m < n
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    o_s = tl.arange(0, SP)
    row_off = ((b * n + o_m.to(tl.int64)[:, None]) * H + h) * D + o_d[None, :]
    b_q = tl.load(q + row_off, mask=m_row[:, None] & m_d[None, :], other=0.0).to(DT)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    o_k = tl.arange(0, KP)
    b_c = tl.load(cells + ((b * n + o_m.to(tl.int64)[:, None]) * H + h) * K + o_k[None, :],
                  mask=m_row[:, None] & (o_k[None, :] < K), other=-1)
    lst = (b * H + h) * NT + pid_t
    for u in range(0, tl.load(ucount + lst)):
        c = tl.load(ucells + lst * (BM * K) + u)
        # how often each row lists c: the reference counts a duplicated cell twice
        mult = tl.sum((b_c == c).to(tl.float32), 1)
        tok = c.to(tl.int64) * S + o_s
        m_tok = (o_s < S) & (tok < T)
        kv_off = ((b * T + tok[:, None]) * H + h) * D + o_d[None, :]
        b_k = tl.load(k + kv_off, mask=m_tok[:, None] & m_d[None, :], other=0.0).to(DT)
        b_v = tl.load(v + kv_off, mask=m_tok[:, None] & m_d[None, :], other=0.0).to(DT)
        s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale
        s = tl.where((mult > 0)[:, None] & m_tok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None]) * mult[:, None]
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
        m_i = m_new
    # rows that selected nothing: acc = 0 and l = 0 -> y = 0 exactly
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    b_y = acc / l_safe[:, None]
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_y * b_y, 1) / D + eps)
    o = b_y * b_rstd[:, None]
    if HAS_G:
        o = o * tl.load(g + h * s_gh + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
    mask = m_row[:, None] & m_d[None, :]
    tl.store(out + row_off, o.to(out.dtype.element_ty), mask=mask)
    tl.store(y + row_off, b_y, mask=mask)
    stat = (b * H + h) * n + o_m
    tl.store(lse + stat, tl.where(l_i > 0, m_i + tl.log2(l_safe), 0.0), mask=m_row)
    tl.store(rstd + stat, b_rstd, mask=m_row)


@triton.jit
def cell_readout_bwd_preprocess_kernel(
    do, y, rstd, g, dy, delta, dg_part, s_gh, n, H,
    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, HAS_G: tl.constexpr,
):
    """RMSNorm backward per row: dy = r (u - r^2 y mean(u y)), u = g do; delta = dy . y; partial sums of dg."""
    pid_t, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    o_m = pid_t * BM + tl.arange(0, BM)
    m_row = o_m < n
    o_d = tl.arange(0, BD)
    mask = m_row[:, None] & (o_d[None, :] < D)
    row_off = ((b * n + o_m.to(tl.int64)[:, None]) * H + h) * D + o_d[None, :]
    b_do = tl.load(do + row_off, mask=mask, other=0.0).to(tl.float32)
    b_y = tl.load(y + row_off, mask=mask, other=0.0)
    b_r = tl.load(rstd + (b * H + h) * n + o_m, mask=m_row, other=0.0)
    u = b_do
    if HAS_G:
        u = b_do * tl.load(g + h * s_gh + o_d, mask=o_d < D, other=0.0).to(tl.float32)[None, :]
    uy = tl.sum(u * b_y, 1) / D
    b_dy = b_r[:, None] * (u - (b_r * b_r * uy)[:, None] * b_y)
    tl.store(dy + row_off, b_dy, mask=mask)
    tl.store(delta + (b * H + h) * n + o_m, tl.sum(b_dy * b_y, 1), mask=m_row)
    # dg partials [B, NT, H, D], summed on the host (deterministic, no atomics)
    part = tl.sum(b_do * b_y * b_r[:, None], 0)
    tl.store(dg_part + ((b * tl.num_programs(0) + pid_t) * H + h) * D + o_d, part, mask=o_d < D)


@triton.jit
def _backward_rows(q, dy, lse, delta, row, m_row, b, h, n, H, D: tl.constexpr, BD: tl.constexpr, DT: tl.constexpr):
    """What the backward reads of query rows `row` (int64 `[R]`, masked by m_row) of head h: their
    offsets and mask `[R, BD]`, q (DT), dy (fp32), lse and delta."""
    o_d = tl.arange(0, BD)
    row_off = ((b * n + row[:, None]) * H + h) * D + o_d[None, :]
    row_mask = m_row[:, None] & (o_d < D)[None, :]
    b_q = tl.load(q + row_off, mask=row_mask, other=0.0).to(DT)
    # dy is the RMSNorm gradient, a difference of two terms: it stays fp32 through its dots
    # (PREC_DY: exact, or three tf32 passes for half inputs) instead of rounding to bf16
    b_dy = tl.load(dy + row_off, mask=row_mask, other=0.0)
    stat = (b * H + h) * n + row
    b_lse = tl.load(lse + stat, mask=m_row, other=0.0)
    b_delta = tl.load(delta + stat, mask=m_row, other=0.0)
    return row_off, row_mask, b_q, b_dy, b_lse, b_delta


@triton.jit
def cell_readout_bwd_kernel(
    q, k, v, cells, ucells, ucount, dy, lse, delta, dq, dk, dv,
    n, T, H, NT, qk_scale, scale,
    S: tl.constexpr, SP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, PREC_DY: tl.constexpr, ATOMIC_DKDV: tl.constexpr,
):
    """dq per query tile; with ATOMIC_DKDV also the tile's atomic share of its cells' dk/dv."""
    pid_t, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    o_m = pid_t * BM + tl.arange(0, BM)
    m_row = o_m < n
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    o_s = tl.arange(0, SP)
    row_off, row_mask, b_q, b_dy, b_lse, b_delta = _backward_rows(q, dy, lse, delta, o_m.to(tl.int64), m_row, b, h,
                                                                  n, H, D, BD, DT)
    b_dq = tl.zeros([BM, BD], tl.float32)
    o_k = tl.arange(0, KP)
    b_c = tl.load(cells + ((b * n + o_m.to(tl.int64)[:, None]) * H + h) * K + o_k[None, :],
                  mask=m_row[:, None] & (o_k[None, :] < K), other=-1)
    lst = (b * H + h) * NT + pid_t
    for u in range(0, tl.load(ucount + lst)):
        c = tl.load(ucells + lst * (BM * K) + u)
        # how often each row lists c: the reference counts a duplicated cell twice
        mult = tl.sum((b_c == c).to(tl.float32), 1)
        tok = c.to(tl.int64) * S + o_s
        m_tok = (o_s < S) & (tok < T)
        kv_off = ((b * T + tok[:, None]) * H + h) * D + o_d[None, :]
        kv_mask = m_tok[:, None] & m_d[None, :]
        b_k = tl.load(k + kv_off, mask=kv_mask, other=0.0).to(DT)
        b_v = tl.load(v + kv_off, mask=kv_mask, other=0.0).to(DT)
        s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale
        use = (mult > 0)[:, None] & m_tok[None, :]
        p = tl.where(use, tl.exp2(s - b_lse[:, None]) * mult[:, None], 0.0)
        dp = tl.dot(b_dy, tl.trans(b_v.to(tl.float32)), input_precision=PREC_DY)
        ds = p * (dp - b_delta[:, None])
        b_dq += tl.dot(ds.to(b_k.dtype), b_k, input_precision=PREC)
        if ATOMIC_DKDV:
            # this tile's share of the cell's gradients, one [S, D] block for all its queries
            b_dk = tl.dot(tl.trans(ds.to(b_q.dtype)), b_q, input_precision=PREC) * scale
            b_dv = tl.dot(tl.trans(p), b_dy, input_precision=PREC_DY)
            tl.atomic_add(dk + kv_off, b_dk, mask=kv_mask)
            tl.atomic_add(dv + kv_off, b_dv, mask=kv_mask)
    tl.store(dq + row_off, (b_dq * scale).to(dq.dtype.element_ty), mask=row_mask)


@triton.jit
def cell_readout_bwd_dkdv_kernel(
    q, k, v, rows, starts, dy, lse, delta, dk, dv,
    n, T, H, C, qk_scale, scale,
    S: tl.constexpr, SP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, PREC_DY: tl.constexpr,
):
    """dk/dv of one cell of one head: its selections `rows[starts[seg]:starts[seg + 1]]` (query rows,
    one entry per selection, so a row that lists the cell twice counts twice, as in the reference),
    BM at a time; the gradients accumulate in registers and are stored once, in k's dtype."""
    pid_c, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    seg = pid_bh.to(tl.int64) * C + pid_c
    lo = tl.load(starts + seg)
    hi = tl.load(starts + seg + 1)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    o_s = tl.arange(0, SP)
    tok = pid_c.to(tl.int64) * S + o_s
    m_tok = (o_s < S) & (tok < T)
    kv_off = ((b * T + tok[:, None]) * H + h) * D + o_d[None, :]
    kv_mask = m_tok[:, None] & m_d[None, :]
    b_k = tl.load(k + kv_off, mask=kv_mask, other=0.0).to(DT)
    b_v = tl.load(v + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
    b_dk = tl.zeros([SP, BD], tl.float32)
    b_dv = tl.zeros([SP, BD], tl.float32)
    o_e = tl.arange(0, BM)
    for first in range(lo, hi, BM):
        m_e = first + o_e < hi
        row = tl.load(rows + first + o_e, mask=m_e, other=0).to(tl.int64)
        _, _, b_q, b_dy, b_lse, b_delta = _backward_rows(q, dy, lse, delta, row, m_e, b, h, n, H, D, BD, DT)
        s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale
        p = tl.where(m_e[:, None] & m_tok[None, :], tl.exp2(s - b_lse[:, None]), 0.0)
        dp = tl.dot(b_dy, tl.trans(b_v), input_precision=PREC_DY)
        ds = p * (dp - b_delta[:, None])
        b_dk += tl.dot(tl.trans(ds.to(DT)), b_q, input_precision=PREC)
        b_dv += tl.dot(tl.trans(p), b_dy, input_precision=PREC_DY)
    tl.store(dk + kv_off, (b_dk * scale).to(dk.dtype.element_ty), mask=kv_mask)
    tl.store(dv + kv_off, b_dv.to(dv.dtype.element_ty), mask=kv_mask)


@triton.jit
def _tile_slots(cells, o_u, pid_t, b, h, s_b, s_n, s_h, s_k, n, K: tl.constexpr, BM: tl.constexpr):
    """The ids in slots `o_u` (slot = row * K + k) of query tile pid_t, in cells' dtype (int64 or
    int32); unused ones (-1, rows past n, slots past BM K) read as _NONE."""
    row = pid_t * BM + o_u // K
    m_u = (o_u < BM * K) & (row < n)
    # cells may be any view (strides); B N H K can pass 2^31, so the offsets are int64
    off = b * s_b + row.to(tl.int64) * s_n + h * s_h + (o_u % K).to(tl.int64) * s_k
    c = tl.load(cells + off, mask=m_u, other=-1)
    return tl.where(c < 0, _NONE_JIT, c)


@triton.jit
def unique_cells_kernel(
    cells, ucells, ucount, s_b, s_n, s_h, s_k, n, H, NT,
    K: tl.constexpr, BM: tl.constexpr, UP: tl.constexpr, BJ: tl.constexpr,
):
    """The list of one query tile of one head (`unique_cells`): its distinct cells ascending, then
    `_NONE`, and their count. Every slot is compared with every other in registers, no sort: a slot
    is first if no earlier slot holds its id, and a first slot's place in the list is the number of
    first slots with a smaller id. The comparisons run BJ slots at a time, `[UP, BJ]` tiles (one
    `[UP, UP]` tile up to UP = 64), so that registers do not grow as UP^2 (`_unique_meta`)."""
    pid_t, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    U: tl.constexpr = BM * K
    o_u = tl.arange(0, UP)
    # ids stay in cells' dtype until stored: an int64 id compares as the reference's int64 sort does
    c = _tile_slots(cells, o_u, pid_t, b, h, s_b, s_n, s_h, s_k, n, K, BM)
    seen = tl.zeros([UP], tl.int32)  # earlier slots that hold the same id
    pos = tl.zeros([UP], tl.int32)  # first slots that hold a smaller id
    for j0 in range(0, UP, BJ):
        # a register tensor cannot be sliced: the BJ slots compared with all are read again (L1-hot)
        o_j = j0 + tl.arange(0, BJ)
        c_j = _tile_slots(cells, o_j, pid_t, b, h, s_b, s_n, s_h, s_k, n, K, BM)
        same = c[:, None] == c_j[None, :]  # [UP, BJ]
        seen += tl.sum((same & (o_j[None, :] < o_u[:, None])).to(tl.int32), 1)
        first_j = (c_j != _NONE_JIT) & (tl.sum((same & (o_u[:, None] < o_j[None, :])).to(tl.int32), 0) == 0)
        pos += tl.sum(((c_j[None, :] < c[:, None]) & first_j[None, :]).to(tl.int32), 1)
    first = (c != _NONE_JIT) & (seen == 0)
    count = tl.sum(first.to(tl.int32), 0)
    # the reference sorts _NONE before ids above it (int64 ids >= 2^31 - 1, never a real cell): its
    # U - count pads then sit between the ids below _NONE and those above, and so do ours
    below = tl.sum((first & (c < _NONE_JIT)).to(tl.int32), 0)
    pos = tl.where(c > _NONE_JIT, pos + (U - count), pos)
    lst = (b * H + h) * NT + pid_t
    out = ucells + lst * U
    tl.store(out + pos, c.to(tl.int32), mask=first)
    tl.store(out + o_u, tl.full([UP], _NONE_JIT, tl.int32), mask=(o_u >= below) & (o_u < below + U - count))
    tl.store(ucount + lst, count)


def _unique_meta(top_k: int, block_m: int) -> tuple[dict, int]:
    """`unique_cells_kernel`'s constexprs and warps (shared with the compile check, `launches`):
    comparison tiles of at most 32 pairs a thread, which ptxas fits in registers without spilling
    for int64 ids up to K = MAX_TOP_K (one `[64, 64]` tile at K = 4, `[1024, 8]` tiles at K = 64)."""
    up = next_pow2(block_m * top_k)
    warps = 4 if up <= 128 else 8
    return dict(K=top_k, BM=block_m, UP=up, BJ=min(up, 32 * 32 * warps // up)), warps


def unique_cells(cells: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, head, query tile): the sorted distinct cells its queries chose, in one launch
    (`unique_cells_kernel`); bit-identical to `unique_cells_reference`.

    cells `[B, N, H, K]` (int64 or int32, any strides) -> ucells int32 `[B, H, NT, BM*K]` (ids
    first, then padding) and ucount int32 `[B, H, NT]`. O(N K) memory, no sort, no wait for the GPU.
    """
    bsz, seq, heads, top_k = cells.shape
    num_tiles = triton.cdiv(seq, block_m)
    ucells = torch.empty((bsz, heads, num_tiles, block_m * top_k), device=cells.device, dtype=torch.int32)
    ucount = torch.empty((bsz, heads, num_tiles), device=cells.device, dtype=torch.int32)
    if not ucells.numel():  # no tile, or K = 0: every list is empty
        return ucells, ucount.zero_()
    meta, warps = _unique_meta(top_k, block_m)
    unique_cells_kernel[(num_tiles, bsz * heads)](
        cells, ucells, ucount, *cells.stride(), seq, heads, num_tiles, **meta, num_warps=warps,
    )
    return ucells, ucount


def unique_cells_reference(cells: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`unique_cells` in plain PyTorch (two sorts), the reference the kernel is tested against.

    cells `[B, N, H, K]` -> ucells int32 `[B, H, NT, BM*K]` (ids first, then
    padding) and ucount int32 `[B, H, NT]`. O(N K) memory, two sorts.
    """
    bsz, seq, heads, top_k = cells.shape
    num_tiles = triton.cdiv(seq, block_m)
    pad = num_tiles * block_m - seq
    c = torch.nn.functional.pad(cells.to(torch.int64), (0, 0, 0, 0, 0, pad), value=-1)
    # B (NT BM) H K -> B H NT (BM K)
    c = c.view(bsz, num_tiles, block_m, heads, top_k).permute(0, 3, 1, 2, 4).reshape(bsz, heads, num_tiles, -1)
    c = torch.where(c < 0, _NONE, c).sort(dim=-1).values
    dup = torch.zeros_like(c, dtype=torch.bool)
    dup[..., 1:] = c[..., 1:] == c[..., :-1]
    c = torch.where(dup, _NONE, c).sort(dim=-1).values
    count = (c != _NONE).sum(dim=-1).to(torch.int32)
    return c.to(torch.int32).contiguous(), count.contiguous()


def selections_by_cell(cells: torch.Tensor, num_cells: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The selections grouped by (batch, head, cell), for the by-cell dk/dv kernel.

    cells `[B, n, H, K]` (ids `< num_cells`, -1 unused) -> rows int32 `[B n H K]` (the query row of
    each selection, unused ones last) and starts int64 `[B H num_cells + 1]`: the selections of
    segment `(b H + h) num_cells + c` are `rows[starts[seg]:starts[seg + 1]]`, rows ascending (a
    stable sort: the same order on every run). O(B n H K) memory, one sort and one search; nothing
    waits for the GPU.
    """
    bsz, seq, heads, top_k = cells.shape
    segments = bsz * heads * num_cells
    key_dtype = torch.int32 if segments < 2**31 - 1 else torch.int64
    ids = torch.arange(bsz, device=cells.device, dtype=key_dtype).view(bsz, 1, 1, 1) * heads
    ids = (ids + torch.arange(heads, device=cells.device, dtype=key_dtype).view(1, 1, heads, 1)) * num_cells
    seg = torch.where(cells >= 0, ids + cells.to(key_dtype), segments).reshape(-1)
    sorted_seg, order = torch.sort(seg, stable=True)
    # flat selection index ((b n + i) H + h) K + slot -> its query row i
    rows = torch.div(order, heads * top_k, rounding_mode="floor").remainder(seq).to(torch.int32)
    # segment c starts at the number of selections sorted before it; a search of the sorted keys
    # rather than a bincount, whose output size depends on the data and so waits for the GPU
    bounds = torch.arange(segments + 1, device=cells.device, dtype=key_dtype)
    starts = torch.searchsorted(sorted_seg, bounds).to(torch.int64)
    return rows.contiguous(), starts


def _gain(rms_weight, heads, device):
    """(pointer tensor, head stride, has_gain): `[d]` gains broadcast over heads with stride 0."""
    if rms_weight is None:
        return torch.empty(1, device=device, dtype=torch.float32), 0, False
    w = rms_weight.detach().contiguous()
    return w, (w.shape[-1] if w.dim() == 2 else 0), True


def _meta(dtype: torch.dtype, dim: int, cell_size: int, top_k: int, gpu: bool = False) -> tuple[dict, str]:
    """Constexprs shared by the forward and backward kernels (and the compile check, `launches`),
    and the input precision of the backward's fp32 dots with the RMSNorm gradient."""
    dots = dot_args(dtype, gpu=gpu)
    # exact for fp32 operands (and on the interpreter), 3xTF32 (about fp32 accuracy) for half inputs
    prec_dy = dots["PREC"] if dots["DT"] == tl.float32 else "tf32x3"
    return dict(S=cell_size, SP=max(16, next_pow2(cell_size)), K=top_k, KP=next_pow2(top_k), D=dim,
                BD=padded_dim(dim), BM=_BM, **dots), prec_dy


def cell_readout_fwd(q, k, v, cells, ucells, ucount, rms_weight, cell_size: int, eps: float):
    """Returns LR `[B, n, H, D]` (q's dtype), y fp32 `[B, n, H, D]`, lse and rstd fp32 `[B, H, n]`."""
    bsz, seq, heads, dim = q.shape
    out = torch.empty_like(q)
    y = torch.empty((bsz, seq, heads, dim), device=q.device, dtype=torch.float32)
    lse = torch.empty((bsz, heads, seq), device=q.device, dtype=torch.float32)
    rstd = torch.empty((bsz, heads, seq), device=q.device, dtype=torch.float32)
    g, s_gh, has_g = _gain(rms_weight, heads, q.device)
    num_tiles = ucount.shape[-1]
    meta, _ = _meta(q.dtype, dim, cell_size, cells.shape[-1])
    cell_readout_fwd_kernel[(num_tiles, bsz * heads)](
        q, k, v, cells, ucells, ucount, g, out, y, lse, rstd,
        s_gh, seq, k.shape[1], heads, num_tiles, eps, _LOG2E / math.sqrt(dim), HAS_G=has_g, **meta,
        num_stages=readout_stages(q.dtype, dim, cell_size, device_target(q.device)),
    )
    return out, y, lse, rstd


def cell_readout_bwd(q, k, v, cells, ucells, ucount, rms_weight, y, lse, rstd, do, cell_size: int,
                     dkdv: str = "by_cell"):
    """Gradients dq, dk, dv (input dtypes) and d rms_weight (its shape and dtype, or None); dk/dv by
    cell (`cell_readout_bwd_dkdv_kernel`) or by atomic adds from the query tiles (`dkdv`, `DKDV`)."""
    _check_dkdv(dkdv)
    bsz, seq, heads, dim = q.shape
    total = k.shape[1]
    do = do.contiguous()
    g, s_gh, has_g = _gain(rms_weight, heads, q.device)
    num_tiles = ucount.shape[-1]
    dy = torch.empty((bsz, seq, heads, dim), device=q.device, dtype=torch.float32)
    delta = torch.empty((bsz, heads, seq), device=q.device, dtype=torch.float32)
    dg_part = torch.empty((bsz, num_tiles, heads, dim), device=q.device, dtype=torch.float32)
    cell_readout_bwd_preprocess_kernel[(num_tiles, bsz * heads)](
        do, y, rstd, g, dy, delta, dg_part, s_gh, seq, heads, D=dim, BD=padded_dim(dim), BM=_BM, HAS_G=has_g,
    )
    dq = torch.empty_like(q)
    arch = device_target(q.device)
    by_cell = readout_by_cell_tiles(q.dtype, dim, cell_size, arch) if dkdv == "by_cell" else None
    atomic = by_cell is None  # also where a cell's tiles do not fit the by-cell kernel's shared memory
    # cells nobody chose (and the incomplete tail) keep zero gradients; atomics accumulate in fp32
    dk = torch.zeros((bsz, total, heads, dim), device=q.device, dtype=torch.float32 if atomic else k.dtype)
    dv = torch.zeros((bsz, total, heads, dim), device=q.device, dtype=torch.float32 if atomic else v.dtype)
    meta, prec_dy = _meta(q.dtype, dim, cell_size, cells.shape[-1])
    stages = readout_stages(q.dtype, dim, cell_size, arch)
    qk_scale, scale = _LOG2E / math.sqrt(dim), 1.0 / math.sqrt(dim)
    cell_readout_bwd_kernel[(num_tiles, bsz * heads)](
        q, k, v, cells, ucells, ucount, dy, lse, delta, dq, dk, dv,
        seq, total, heads, num_tiles, qk_scale, scale, PREC_DY=prec_dy, ATOMIC_DKDV=atomic, **meta,
        num_stages=stages,
    )
    num_cells = total // cell_size
    if not atomic and num_cells > 0:
        rows, starts = selections_by_cell(cells, num_cells)
        cell_readout_bwd_dkdv_kernel[(num_cells, bsz * heads)](
            q, k, v, rows, starts, dy, lse, delta, dk, dv,
            seq, total, heads, num_cells, qk_scale, scale, PREC_DY=prec_dy, **_by_cell_meta(meta, by_cell[0]),
            num_warps=_by_cell_warps(meta), num_stages=by_cell[1],
        )
    dg = None
    if rms_weight is not None:
        dg = dg_part.sum(dim=(0, 1))  # H D
        if rms_weight.dim() == 1:
            dg = dg.sum(dim=0)
        dg = dg.to(rms_weight.dtype)
    return dq, dk.to(k.dtype), dv.to(v.dtype), dg


def _check_dkdv(dkdv: str) -> None:
    if dkdv not in DKDV:
        raise ValueError(f"dkdv must be one of {DKDV}, got {dkdv!r}")


def _by_cell_meta(meta: dict, selections: int) -> dict:
    """The by-cell dk/dv kernel's constexprs, from the readout's (`_meta`) and its selections per step."""
    return dict(S=meta["S"], SP=meta["SP"], D=meta["D"], BD=meta["BD"], BM=selections, DT=meta["DT"],
                PREC=meta["PREC"])


def _by_cell_warps(meta: dict) -> int:
    """8 warps where a cell's two fp32 accumulators (SP x BD each) would crowd 4 warps' registers."""
    return 8 if meta["SP"] * meta["BD"] >= 4096 else 4


def launches(dtype: torch.dtype, dim: int, cell_size: int, top_k: int, arch: int) -> list:
    """The compiled variants of the readout for one configuration on target `arch`
    (`fsf_kernels.common.targets`); the tiles are the same on every target, the stages are not."""
    meta, prec_dy = _meta(dtype, dim, cell_size, top_k, gpu=True)
    stages = readout_stages(dtype, dim, cell_size, arch)
    p, f32, i32 = ptr(dtype), "*fp32", "*i32"
    unique_meta, unique_warps = _unique_meta(top_k, _BM)
    out = [launch("readout unique cells", unique_cells_kernel, dict(cells="*i64", ucells=i32, ucount=i32),
                  unique_meta, num_warps=unique_warps)]
    for has_g in (False, True):
        out.append(launch(f"readout fwd{' gain' if has_g else ''}", cell_readout_fwd_kernel,
                          dict(q=p, k=p, v=p, cells="*i64", ucells=i32, ucount=i32, g=p, out=p, y=f32, lse=f32,
                               rstd=f32), dict(meta, HAS_G=has_g), floats={"eps", "qk_scale"},
                          num_stages=stages))
    out.append(launch("readout bwd rows", cell_readout_bwd_preprocess_kernel,
                      dict(do=p, y=f32, rstd=f32, g=p, dy=f32, delta=f32, dg_part=f32),
                      dict(D=dim, BD=meta["BD"], BM=_BM, HAS_G=True)))
    for atomic in (False, True):
        out.append(launch(f"readout bwd {'dq dk dv atomic' if atomic else 'dq'}", cell_readout_bwd_kernel,
                          dict(q=p, k=p, v=p, cells="*i64", ucells=i32, ucount=i32, dy=f32, lse=f32, delta=f32,
                               dq=p, dk=f32 if atomic else p, dv=f32 if atomic else p),
                          dict(meta, PREC_DY=prec_dy, ATOMIC_DKDV=atomic), floats={"qk_scale", "scale"},
                          num_stages=stages))
    by_cell = readout_by_cell_tiles(dtype, dim, cell_size, arch)
    if by_cell is not None:
        out.append(launch("readout bwd dk dv by cell", cell_readout_bwd_dkdv_kernel,
                          dict(q=p, k=p, v=p, rows=i32, starts="*i64", dy=f32, lse=f32, delta=f32, dk=p, dv=p),
                          dict(_by_cell_meta(meta, by_cell[0]), PREC_DY=prec_dy), floats={"qk_scale", "scale"},
                          num_warps=_by_cell_warps(meta), num_stages=by_cell[1]))
    return out


class CellReadoutFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cells, rms_weight, cell_size, eps, dkdv):
        q, k, v, cells = (x.contiguous() for x in (q, k, v, cells))
        ucells, ucount = unique_cells(cells, _BM)
        out, y, lse, rstd = cell_readout_fwd(q, k, v, cells, ucells, ucount, rms_weight, cell_size, eps)
        ctx.save_for_backward(q, k, v, cells, ucells, ucount, rms_weight, y, lse, rstd)
        ctx.cell_size, ctx.dkdv = cell_size, dkdv
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, cells, ucells, ucount, rms_weight, y, lse, rstd = ctx.saved_tensors
        dq, dk, dv, dg = cell_readout_bwd(q, k, v, cells, ucells, ucount, rms_weight, y, lse, rstd, do,
                                          ctx.cell_size, ctx.dkdv)
        return dq, dk, dv, None, dg, None, None, None


def cell_readout(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cells: torch.Tensor,
    config,
    *,
    rms_weight: torch.Tensor | None = None,
    eps: float = 1e-8,
    q_start: int = 0,
    dkdv: str = "by_cell",
) -> torch.Tensor:
    """Selected-cell readout, same contract as `fsframework.ops.freesolo.cell_readout`.

    q, k, v: unrotated `[B, N, H, D]` (one dtype: fp32/fp16/bf16); cells:
    `[B, N, H, K]` int64/int32 cell ids, -1 = unused (ids must be complete
    cells, `< N // cell_size`; the reference's dispatcher checks this). One
    softmax jointly over the `K * cell_size` selected tokens with logits
    `q_i . k_j / sqrt(D)` (no RoPE), then RMSNorm over D in fp32 with gain
    `rms_weight` `[H, D]`, `[D]` or None and `eps`. Rows that selected
    nothing are exactly 0 with zero gradients. Returns `[B, N, H, D]` in q's
    dtype; differentiable w.r.t. q, k, v and rms_weight.

    q_start: q and cells hold only the n queries of positions `[q_start, q_start + n)`, k and v
    the keys of `[0, q_start + n)`; only those queries are read out -> `[B, n, H, D]` (the logits
    carry no position, so the offset only sets which keys exist).

    config: the layer's settings (a `fsframework.ops.freesolo_config.FreeSoloConfig`; the readout reads its
    cell_size).

    dkdv: how the backward forms dk/dv, "by_cell" (one program per cell, no atomics, deterministic;
    atomic instead where a cell's tiles do not fit, `support.readout_by_cell_tiles`) or "atomic" (each
    query tile adds its share); the same gradients up to rounding order.
    """
    cell_size = config.cell_size
    check_readout_args(q, k, v, cells, cell_size=cell_size, rms_weight=rms_weight, q_start=q_start)
    _check_dkdv(dkdv)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_head_dim("q", q)
    reason = readout_unsupported(q.dtype, q.shape[-1], top_k=cells.shape[3], cell_size=cell_size)
    if reason:
        raise ValueError(f"the Triton readout kernel does not support this call: {reason}")
    if q.shape[1] == 0:
        return q * 0  # an empty slice, still on q's graph
    return CellReadoutFunction.apply(q, k, v, cells, rms_weight, int(cell_size), float(eps), dkdv)
