"""FreeSolo cell routing (docs/freesolo.md §1.3-§1.6) in Triton: FS and FS-L top-K selection.

Three kernels: a summary pre-pass (mean key, largest key norm per complete
cell), the FS-L retention scan (top-P cells by norm per query block, kept
incrementally per head), and the scorer: one program per query tile of one
query block, scoring its available cells tile by tile and keeping a running
top-K in registers, so no score matrix is ever written to global memory.
No gradient (the selection is hard).

Packed documents (`first_cells`, `fsframework.ops.freesolo_documents`): documents laid end to end
in a row, each from a query-block boundary. The retention scan and the scorer take the first cell
of each query block's document (`first` `[NB]` int32, the `DOCS` variants): a block scores only
the cells `[first, n_j)` (its loop starts there, so the work is per document), and FS-L's retained
list restarts empty where `first` changes. One launch per kernel however many documents.

Legend: B batch, N tokens, H heads, D head dim, S cell size, C = N // S
complete cells, NB query blocks, K top_k, P retained cells, W recent cells.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fsf_kernels.common.args import (check_first_cells, check_head_dim, check_routing_args, check_summaries,
                                    prior_per_head)
from fsf_kernels.common.support import (device_target, padded_dim, routing_cell_tile, routing_query_rows,
                                        routing_unsupported)
from fsf_kernels.common.targets import launch, ptr
from fsf_kernels.common.topk import topk_init, topk_merge, topk_sorted
from fsf_kernels.common.utils import dot_args, next_pow2


@triton.jit
def cell_summary_kernel(k, kbar, a, s_kb, s_kt, s_kh, H, C, S: tl.constexpr, SP: tl.constexpr, D: tl.constexpr,
                        BD: tl.constexpr):
    """kbar `[B, H, C, D]` = mean key of cell c, a `[B, H, C]` = its largest key L2 norm (fp32)."""
    c, pid_bh = tl.program_id(0), tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    o_s = tl.arange(0, SP)
    o_d = tl.arange(0, BD)
    rows = c.to(tl.int64) * S + o_s
    mask = (o_s[:, None] < S) & (o_d[None, :] < D)
    x = tl.load(k + b * s_kb + h * s_kh + rows[:, None] * s_kt + o_d[None, :], mask=mask, other=0.0).to(tl.float32)
    base = (b * H + h) * C + c
    tl.store(kbar + base * D + o_d, tl.sum(x, 0) / S, mask=o_d < D)
    # padded rows have norm 0 and every norm is >= 0, so they never win the max
    tl.store(a + base, tl.max(tl.sqrt(tl.sum(x * x, 1)), 0))


@triton.jit
def fsl_retain_kernel(a, kept, first, C, NB, BLK: tl.constexpr, S: tl.constexpr, P: tl.constexpr, PP: tl.constexpr,
                      NEW: tl.constexpr, NEWP: tl.constexpr, DOCS: tl.constexpr):
    """kept `[B*H, NB, PP]` int32: per block, the P eligible cells of largest a (ties: earlier), -1 = empty.

    Sequential over blocks, one program per (batch, head). Row j-1 holds the previous block's
    top-P sorted best first; the NEW = BLK/S newly eligible cells are merged into it (a sorted
    merge): a kept cell's new slot is its old slot plus the new cells that beat it, a new cell's
    slot is the kept cells it does not beat plus the new cells that beat it. The comparisons are
    `[PP, NEWP]` and `[NEWP, NEWP]`, never `[PP, PP]`, so registers and compile time grow with P,
    not P^2. The merged row is scattered to global memory and read back as the next state.

    DOCS: `first` `[NB]` holds each block's document's first cell; where it changes (a document's
    first block) the kept row is emptied, and only new cells `>= first` are admitted, so every
    document's retained lists are those of the document alone.
    """
    bh = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, PP)
    o_new = tl.arange(0, NEWP)
    valid_n = o_new < NEW
    row = kept + bh * NB * PP
    tl.store(row + slots, tl.full([PP], -1, tl.int32))
    for j in range(1, NB):
        tl.debug_barrier()  # row j-1 written by every thread before any reads it
        si = tl.load(row + (j - 1) * PP + slots)
        valid_s = si >= 0
        fresh = valid_n
        if DOCS:
            doc = tl.load(first + j)
            valid_s = valid_s & (doc == tl.load(first + j - 1))  # a new document: nothing kept
            fresh = fresh & ((j - 1) * BLK // S + o_new >= doc)  # cells of earlier documents never enter
        count = tl.sum(valid_s.to(tl.int32), 0)
        sv = tl.load(a + bh * C + si, mask=valid_s, other=float("-inf"))
        c_new = (j - 1) * BLK // S + o_new
        nv = tl.load(a + bh * C + c_new, mask=fresh, other=float("-inf"))
        # every kept cell precedes every new cell, so on equal a the kept one wins
        new_beats_kept = (nv[None, :] > sv[:, None]) & fresh[None, :]  # [PP, NEWP]
        rank_s = slots + tl.sum(new_beats_kept.to(tl.int32), 1)
        rank_n = tl.sum(((sv[None, :] >= nv[:, None]) & valid_s[None, :]).to(tl.int32), 1)  # [NEWP, PP] -> [NEWP]
        n_beats_n = (nv[None, :] > nv[:, None]) | ((nv[None, :] == nv[:, None]) & (o_new[None, :] < o_new[:, None]))
        rank_n += tl.sum((n_beats_n & fresh[None, :]).to(tl.int32), 1)
        # ranks of the union are 0 .. count + new - 1, each once: the scatter fills exactly the
        # first min(P, count + new) slots, and the rest are emptied
        out = row + j * PP
        if DOCS:
            total = tl.minimum(count + tl.sum(fresh.to(tl.int32), 0), P)
        else:
            total = tl.minimum(count + NEW, P)
        tl.store(out + slots, tl.full([PP], -1, tl.int32), mask=slots >= total)
        tl.store(out + rank_s, si, mask=valid_s & (rank_s < P))
        tl.store(out + rank_n, c_new, mask=fresh & (rank_n < P))


@triton.jit
def _score_tile(b_q, kbar_bh, a_bh, idx, valid, pos, lam_h, two_sigma, scale, S: tl.constexpr, D: tl.constexpr,
                BD: tl.constexpr, PREC: tl.constexpr):
    """r = q.kbar/sqrt(D) + lam*a*erf((i - p_c)/(2 sigma)) for cells idx `[BC]` -> `[BM, BC]`, -inf if not valid."""
    o_d = tl.arange(0, BD)
    b_kbar = tl.load(kbar_bh + idx.to(tl.int64)[:, None] * D + o_d[None, :], mask=valid[:, None] & (o_d[None, :] < D),
                     other=0.0)
    b_a = tl.load(a_bh + idx, mask=valid, other=0.0)
    content = tl.dot(b_q, tl.trans(b_kbar), input_precision=PREC) * scale
    center = (idx.to(tl.float32) + 0.5) * S
    weight = (lam_h * b_a)[None, :]
    # every query of the tile at least 5 widths (2 sigma) from every cell: erf is exactly 1 in fp32
    # there (from 4 on: 1 - erf(4) = 1.5e-8 is below half an ulp of 1; 5 leaves a margin for
    # libdevice's and torch's erf alike), so the prior is lam a and erf, most of a tile's arithmetic,
    # is skipped. Far into a long prefix almost every tile is such a tile (sigma 4: 40 tokens).
    nearest = tl.min(pos, 0) - tl.max(tl.where(valid, center, float("-inf")), 0)
    if nearest >= 5.0 * two_sigma:
        prior = weight + tl.zeros_like(content)
    else:
        prior = weight * tl.math.erf((pos[:, None] - center[None, :]) / two_sigma)
    return tl.where(valid[None, :], content + prior, float("-inf"))


@triton.jit
def select_cells_fwd_kernel(
    q, kbar, a, kept, first, sigma, lam, out,
    s_qb, s_qt, s_qh,
    n, J0, H, C, NB, TPB, W, scale,
    BLK: tl.constexpr, S: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BM: tl.constexpr, BC: tl.constexpr, PP: tl.constexpr, BCK: tl.constexpr, FSL: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, DOCS: tl.constexpr,
):
    """One query tile inside query block j: every row shares the eligible prefix of n_j cells.

    q and out hold the n queries of positions `[J0 BLK, J0 BLK + n)` (J0 = q_start / BLK): the
    grid covers only their blocks, and positions (the prior, eligibility) are absolute.

    DOCS (J0 = 0): `first[j]` is the first cell of block j's document; the block scores only cells
    `[first[j], n_j)` (FS-L: its recent cells are `[max(first[j], n_j - W), n_j)`, its retained list
    holds only the document's cells), and the cell loop starts at `first[j]`."""
    pid, pid_bh = tl.program_id(0), tl.program_id(1)
    j = J0 + pid // TPB
    r0 = (pid % TPB) * BM
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    bh = b * H + h
    o_r = r0 + tl.arange(0, BM)
    o_m = j * BLK + o_r  # absolute positions
    o_l = o_m - J0 * BLK  # rows of q and out
    m_row = (o_r < BLK) & (o_l < n)
    o_d = tl.arange(0, BD)
    p_q = q + b * s_qb + h.to(tl.int64) * s_qh + o_l.to(tl.int64)[:, None] * s_qt + o_d[None, :]
    b_q = tl.load(p_q, mask=m_row[:, None] & (o_d[None, :] < D), other=0.0).to(tl.float32)
    pos = o_m.to(tl.float32)
    lam_h = tl.load(lam + h)
    two_sigma = 2.0 * tl.load(sigma + h)
    kbar_bh = kbar + bh * C * D
    a_bh = a + bh * C
    n_j = j * BLK // S
    run_v, run_i = topk_init(BM, KP, K)
    low = 0
    if FSL:
        low = tl.maximum(n_j - W, 0)
        row_k = kept + (bh * NB + j) * PP
        # the retained list in chunks of BCK slots, so registers do not grow with P
        for c0 in range(0, PP, BCK):
            idx = tl.load(row_k + c0 + tl.arange(0, BCK))
            # kept cells inside the recent window are counted once, as recent
            valid = (idx >= 0) & (idx < low)
            s = _score_tile(b_q, kbar_bh, a_bh, idx, valid, pos, lam_h, two_sigma, scale, S, D, BD, PREC)
            run_v, run_i = topk_merge(run_v, run_i, s, tl.broadcast_to(idx[None, :], (BM, BCK)), K, KP)
    if DOCS:
        # only the block's own document: the loop starts at its first cell (none before it in a tile)
        low = tl.maximum(low, tl.load(first + j))
    # FS: every cell before the block; FS-L: the W most recent of them
    for c0 in range(low, n_j, BC):
        idx = c0 + tl.arange(0, BC)
        s = _score_tile(b_q, kbar_bh, a_bh, idx, idx < n_j, pos, lam_h, two_sigma, scale, S, D, BD, PREC)
        run_v, run_i = topk_merge(run_v, run_i, s, tl.broadcast_to(idx[None, :], (BM, BC)), K, KP)
    sel = topk_sorted(run_v, run_i, K, KP)
    o_k = tl.arange(0, KP)
    p_out = out + ((b * n + o_l.to(tl.int64)[:, None]) * H + h) * K + o_k[None, :]
    tl.store(p_out, sel.to(tl.int64), mask=m_row[:, None] & (o_k[None, :] < K))


def cell_summary_fwd(k: torch.Tensor, cell_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summaries of the complete cells: kbar `[B, H, C, D]` and a `[B, H, C]`, fp32 (C >= 1 rows allocated)."""
    bsz, seq, heads, dim = k.shape
    num_cells = seq // cell_size
    if k.stride(3) != 1:
        k = k.contiguous()
    kbar = torch.empty((bsz, heads, max(num_cells, 1), dim), device=k.device, dtype=torch.float32)
    a = torch.empty((bsz, heads, max(num_cells, 1)), device=k.device, dtype=torch.float32)
    if num_cells:
        cell_summary_kernel[(num_cells, bsz * heads)](
            k, kbar, a, k.stride(0), k.stride(1), k.stride(2), heads, kbar.shape[2],
            S=cell_size, SP=next_pow2(cell_size), D=dim, BD=next_pow2(dim),
        )
    return kbar, a


def fsl_retain_fwd(a: torch.Tensor, seq: int, cell_size: int, block_size: int, retained: int,
                   first: torch.Tensor | None = None) -> torch.Tensor:
    """Retained cells per query block, `[B*H, NB, PP]` int32 (-1 = empty). first: None, or `[NB]` int32 on
    a's device, each block's document's first cell (the retained lists restart at every document)."""
    bsz, heads, num_alloc = a.shape
    num_blocks = triton.cdiv(seq, block_size)
    pp = retained_width(retained)
    if retained == 0:
        return torch.full((bsz * heads, num_blocks, pp), -1, device=a.device, dtype=torch.int32)
    kept = torch.empty((bsz * heads, num_blocks, pp), device=a.device, dtype=torch.int32)
    new = block_size // cell_size
    fsl_retain_kernel[(bsz * heads,)](
        a, kept, first, num_alloc, num_blocks, BLK=block_size, S=cell_size, P=retained, PP=pp, NEW=new,
        NEWP=next_pow2(new), DOCS=first is not None,
    )
    return kept


def select_cells_fwd(q, kbar, a, kept, sigma_h, lam_h, *, variant, cell_size, block_size, top_k, recent_cells,
                     q_start: int = 0, first: torch.Tensor | None = None):
    """Top-K cells `[B, n, H, K]` int64 in descending score, -1 where fewer are available, for the
    queries q `[B, n, H, D]` at positions `[q_start, q_start + n)` (q_start a multiple of block_size).
    first: None, or (q_start 0) `[NB]` int32 on q's device, each block's document's first cell."""
    bsz, seq, heads, dim = q.shape
    if q.stride(3) != 1:
        q = q.contiguous()
    out = torch.empty((bsz, seq, heads, top_k), device=q.device, dtype=torch.long)
    if seq == 0:
        return out
    meta = scorer_meta(q.dtype, dim, variant=variant, cell_size=cell_size, block_size=block_size, top_k=top_k,
                       pp=kept.shape[-1], arch=device_target(q.device))
    tiles = triton.cdiv(block_size, meta["BM"])
    select_cells_fwd_kernel[(triton.cdiv(seq, block_size) * tiles, bsz * heads)](
        q, kbar, a, kept, first, sigma_h, lam_h, out,
        q.stride(0), q.stride(1), q.stride(2),
        seq, q_start // block_size, heads, kbar.shape[2], kept.shape[1], tiles, recent_cells, 1.0 / math.sqrt(dim),
        **meta, DOCS=first is not None,
    )
    return out


def scorer_meta(dtype: torch.dtype, dim: int, *, variant: str, cell_size: int, block_size: int, top_k: int,
                pp: int, arch: int) -> dict:
    """The scorer's constexprs for a launch on target `arch` (shared with the compile check)."""
    cells = routing_cell_tile(dim, arch)
    return dict(
        BLK=block_size, S=cell_size, K=top_k, KP=next_pow2(top_k), D=dim, BD=padded_dim(dim),
        BM=max(16, min(routing_query_rows(dim), next_pow2(block_size))), BC=cells, PP=pp, BCK=min(pp, cells),
        FSL=variant == "fsl",
        # routing math is fp32; half inputs accept tf32 products for speed
        **dot_args(torch.float32, "ieee" if dtype == torch.float32 else "tf32"),
    )


def launches(dtype: torch.dtype, dim: int, variant: str, top_k: int, retained: int, cell_size: int,
             block_size: int, arch: int) -> list:
    """The compiled variants a launch on sm_`arch` uses (`fsf_kernels.common.targets`), from the launcher's
    own tiles: the summary pre-pass, the scorer and (FS-L) the retention scan, the last two without
    documents (`first` None, a constexpr as the launch makes it: no argument at all) and with them
    (" docs")."""
    p = ptr(dtype)
    pp = retained_width(retained) if variant == "fsl" else 16
    meta = scorer_meta(dtype, dim, variant=variant, cell_size=cell_size, block_size=block_size, top_k=top_k, pp=pp,
                       arch=arch)
    meta.update(dot_args(torch.float32, "ieee" if dtype == torch.float32 else "tf32", gpu=True))
    new = block_size // cell_size
    scorer = dict(q=p, kbar="*fp32", a="*fp32", kept="*i32", sigma="*fp32", lam="*fp32", out="*i64")
    retain = dict(BLK=block_size, S=cell_size, P=retained, PP=pp, NEW=new, NEWP=next_pow2(new))
    out = [launch("routing cell summary", cell_summary_kernel, dict(k=p, kbar="*fp32", a="*fp32"),
                  dict(S=cell_size, SP=next_pow2(cell_size), D=dim, BD=next_pow2(dim)))]
    for docs in (False, True):
        firsts, consts = (dict(first="*i32"), {}) if docs else ({}, dict(first=None))
        tail = " docs" if docs else ""
        out.append(launch("routing scorer" + tail, select_cells_fwd_kernel, dict(scorer, **firsts),
                          dict(meta, DOCS=docs, **consts), floats={"scale"}))
        if variant == "fsl":
            out.append(launch("routing FS-L retention" + tail, fsl_retain_kernel,
                              dict(a="*fp32", kept="*i32", **firsts), dict(retain, DOCS=docs, **consts)))
    return out


def retained_width(retained: int) -> int:
    """Slots of a retained list: P rounded up to a power of two, at least 16 (a `tl.dot` extent)."""
    return max(16, next_pow2(retained))


def select_cells(q: torch.Tensor, k: torch.Tensor, config, prior, *, q_start: int = 0,
                 first_cells: torch.Tensor | None = None) -> torch.Tensor:
    """Top-K cells per query and head, same contract as `fsframework.ops.freesolo.select_cells`.

    config: the layer's settings (a `fsframework.ops.freesolo_config.FreeSoloConfig`: variant, cell_size,
    block_size, top_k, recent_cells, retained_cells), prior: its routing prior (a `RoutingPrior`: sigma,
    lam), each read by field name (the kernels import torch and triton only).

    q, k: unrotated `[B, N, H, D]`, fp32/fp16/bf16. Scores
    `r_ic = q_i . kbar_c / sqrt(D) + lam_h a_c erf((i - p_c) / (2 sigma_h))` over the
    complete cells ending before the query's block (FS), or per head over the
    `recent_cells` most recent of them plus the `retained_cells` of largest `a_c`
    (FS-L). sigma, lam: floats or `[H]` tensors. Ties go to the earlier cell.
    Returns int64 `[B, N, H, top_k]`, best first, -1 where fewer are available.
    For bf16/fp16 inputs the content term uses tf32 products on the GPU, so
    near-tied cells may be ordered differently from the fp32 reference.

    q_start (a multiple of block_size): q holds only the n queries of positions
    `[q_start, q_start + n)`, k the keys of `[0, q_start + n)`; only those queries are scored
    (the cell summaries and FS-L's retained lists still read every key) -> `[B, n, H, top_k]`.

    first_cells (packed documents laid from query-block boundaries, q_start 0): a CPU LongTensor
    `[NB]`, the first cell of each query block's document (`fsf_kernels.common.args.check_first_cells`;
    a document's blocks all name its own first block's first cell): a block scores only its own
    document's cells and FS-L's history restarts at each document, in one launch per kernel.
    """
    check_routing_args(q, k, config, q_start=q_start)
    check_head_dim("q", q)
    if q.dtype != k.dtype:
        raise ValueError(f"q and k must share a dtype, got {q.dtype} and {k.dtype}")
    reason = routing_unsupported(q.dtype, q.shape[-1], config)
    if reason:
        raise ValueError(f"the Triton routing kernel does not support this call: {reason}")
    # the prior's constants are checked here too: a bad sigma must not wait until after a launch
    prior_per_head(prior.sigma, prior.lam, q.shape[2], like=torch.empty((), dtype=torch.float32, device=q.device))
    first = None
    if first_cells is not None:
        firsts = check_first_cells(first_cells, q.shape[1], config, q_start)
        per_block = config.block_size // config.cell_size
        # the retention scan restarts where the first cell changes: that must be the document's first block
        if any(firsts[f // per_block] != f for f in firsts):
            raise ValueError(f"first_cells: every document's blocks must name its own first block's first cell "
                             f"(first_cells[first // (block_size / cell_size)] == first), got {firsts}")
        first = first_cells.to(device=q.device, dtype=torch.int32, non_blocking=True).contiguous()
    kbar, a = cell_summaries(k, config.cell_size)
    return _select(q, kbar, a, config, prior, q_start, first)


def cell_summaries(k: torch.Tensor, cell_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The complete cells' summaries that `select_cells` routes from: kbar `[B, H, C, D]` (mean key) and
    a `[B, H, C]` (largest key L2 norm), fp32, `C = N // cell_size`; no gradient."""
    with torch.no_grad():
        kbar, a = cell_summary_fwd(k.detach(), cell_size)
    num_cells = k.shape[1] // cell_size
    return kbar[:, :, :num_cells], a[:, :, :num_cells]


def select_cells_from_summaries(q: torch.Tensor, kbar: torch.Tensor, a: torch.Tensor, config, prior, *,
                                q_start: int = 0) -> torch.Tensor:
    """`select_cells` from the summaries of the keys rather than the keys: q `[B, n, H, D]` at positions
    `[q_start, q_start + n)`, kbar `[B, H, C, D]` and a `[B, H, C]` (`cell_summaries`) of the complete
    cells of `[0, q_start + n)` -> `[B, n, H, top_k]`. A sequence-parallel rank routes its queries from
    the gathered summaries of every earlier rank (docs/architecture.md). Without documents."""
    check_summaries(q, kbar, a, cell_size=config.cell_size, q_start=q_start)
    return _select(q, kbar, a, config, prior, q_start, None)


def _select(q: torch.Tensor, kbar: torch.Tensor, a: torch.Tensor, config, prior, q_start: int,
            first: torch.Tensor | None) -> torch.Tensor:
    """The launches of `select_cells_from_summaries` (checked summaries); first: None or `[NB]` int32 on
    q's device (`select_cells`)."""
    bsz, num, heads, dim = q.shape
    variant, cell_size, block_size = config.variant, config.cell_size, config.block_size
    num_cells = (q_start + num) // cell_size
    like = torch.empty((), dtype=torch.float32, device=q.device)
    sigma_h, lam_h = prior_per_head(prior.sigma, prior.lam, heads, like=like)
    with torch.no_grad():
        if num_cells == 0:  # the kernels index at least one row; no query has an eligible cell
            kbar, a = kbar.new_zeros((bsz, heads, 1, dim)), a.new_zeros((bsz, heads, 1))
        kbar, a = kbar.float().contiguous(), a.float().contiguous()
        if variant == "fsl":
            kept = fsl_retain_fwd(a, q_start + num, cell_size, block_size, config.retained_cells, first)
        else:
            kept = torch.full((1, 1, 16), -1, device=q.device, dtype=torch.int32)
        return select_cells_fwd(q.detach(), kbar, a, kept, sigma_h, lam_h, variant=variant, cell_size=cell_size,
                                block_size=block_size, top_k=config.top_k, recent_cells=config.recent_cells,
                                q_start=q_start, first=first)
