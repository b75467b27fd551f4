"""FreeSolo long-range branch (docs/freesolo.md §1.3-§1.7): cell routing and selected-cell readout.

Legend: Bt batch, N tokens, H heads, d head width, K top_k, s cell_size,
C = N // s complete cells.

    select_cells(q, k, config, prior)           -> cells [Bt, N, H, K]  (routing, no gradient)
    summarize_cells(k, config)                  -> kbar [Bt, H, C, d], a [Bt, H, C]  (what routing reads of k)
    select_cells_from_summaries(q, kbar, a, config, prior) = select_cells(q, k, config, prior)
    cell_readout(q, k, v, cells, config)        -> LR    [Bt, N, H, d]  (NoPE softmax + RMSNorm)
    cell_readout_kept(q, k_cells, v_cells, cells)            (the same, over a decode cache's cells)
    long_range_attention(q, k, v, config, prior) = cell_readout(q, k, v, select_cells(q, k, config, prior), config)

config: the layer's settings (`FreeSoloConfig`), prior: its routing prior (`RoutingPrior`), each passed
whole (`fsframework.ops.freesolo_config`).

q, k, v are the UNROTATED projections (no RoPE in routing or readout). The
reference routing lives in `freesolo_routing.py` (block by block, `O(N)`
memory), the reference readout in `freesolo_readout.py` (chunks of queries,
recomputed in the backward pass, `O(N H d)` memory). `impl="auto"` runs the
Triton kernels of `fsf_kernels` on CUDA tensors when they import and support
the call (`fsf_kernels.common.support`), the reference elsewhere (see
`fsframework.ops.dispatch`). Both take `q_start` natively: only the given
queries are routed and read out.
"""

from __future__ import annotations

import torch

from fsf_kernels.common.args import check_qkv, check_readout_args
from fsf_kernels.common.support import readout_unsupported, routing_unsupported
from fsframework.ops.dispatch import kernel_for
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_readout import read_cell_rows, selected_cell_attention
from fsframework.ops.freesolo_routing import (select_cells_from_summaries_reference, select_cells_reference,
                                               summaries_by_head)
from fsframework.ops.fsb_search import select_cells_fsb

# the readout RMSNorm's epsilon (docs/freesolo.md §1.6)
READOUT_EPS = 1e-8


def select_cells(q: torch.Tensor, k: torch.Tensor, config: FreeSoloConfig, prior: RoutingPrior, *,
                 q_start: int = 0, first_cells: torch.Tensor | None = None) -> torch.Tensor:
    """Top-K cells per query and head (docs/freesolo.md §1.3-§1.6, §1.8). No gradient flows through it.

    q, k: unrotated `[Bt, N, H, d]`. Cell `c` holds tokens `cs .. cs+s-1`
    (`s = config.cell_size`); its summaries are the mean key `kbar_c`, the center
    `p_c = (c + 1/2) s` and `a_c = max_{j in cell} ||k_j||_2`. Query `i` may use
    the complete cells with `(c+1)s <= b_i`, `b_i = B * floor(i / B)` (`B = config.block_size`;
    so the first block has none and N need not be a multiple of s or B), scored by

        r_ic = q_i . kbar_c / sqrt(d) + lam_h * a_c * erf((i - p_c) / (2 sigma_h)).

    config.variant "fs": every eligible cell is available. "fsl": per head, the
    `recent_cells` (W) most recent eligible cells plus the `retained_cells` (P)
    eligible cells of largest `a_c`. prior.sigma (> 0), prior.lam (>= 0): floats or `[H]`
    tensors. [choice] ties in `a_c` and in `r_ic` go to the earlier cell.

    variant "fsb" (inference only, docs/freesolo.md §1.8; `impl` picks the search's kernel): per head, a beam
    of `beam_width` searches two forests of the eligible cells (`F0`: all; `Ftau`: those
    with `a_c >= tau_h`, prior.tau a `[H]` tensor; `forests` "both", "f0" or "ftau") by the
    bound `U_v` (`bound_c` = c), and the found cells are rescored by Eq. 12 (log-sum-exp
    over the cell's token keys plus the prior); see `fsframework.ops.fsb_search`.

    Returns a LongTensor `[Bt, N, H, top_k]`: cell indices in descending score,
    -1 where fewer than `top_k` cells are available.

    q_start (a multiple of block_size): q holds only the queries of positions
    `[q_start, q_start + n)` and k the keys of `[0, q_start + n)` (a slice of a
    sequence-parallel rank); the result is `[Bt, n, H, top_k]`, equal to rows
    `[q_start, q_start + n)` of the call on the whole sequence.

    first_cells (packed documents laid from query-block boundaries,
    `fsframework.ops.freesolo_documents`): a CPU LongTensor `[NB]`, the first cell of each query
    block's document (`fsf_kernels.common.args.check_first_cells`): a block reads only its own
    document's cells, FS-L's history and FS-B's forests restart at each document, so every document
    routes as if it were a row of its own.
    """
    if config.variant == "fsb":
        return select_cells_fsb(q, k, config, prior, q_start=q_start, first_cells=first_cells)
    kernel = kernel_for("cell_routing", "select_cells", config.impl, q, _routing_unsupported(q, config))
    documents = {} if first_cells is None else {"first_cells": first_cells}
    if kernel is not None:
        # the kernel scores only the given queries (their blocks), over the summaries of every key
        return kernel(q.detach(), k.detach(), config, prior, q_start=q_start, **documents)
    return select_cells_reference(q.detach(), k.detach(), config, prior, q_start=q_start, **documents)


def _routing_unsupported(q: torch.Tensor, config: FreeSoloConfig) -> str | None:
    """Why the routing kernel cannot run this call (None: it can): `routing_unsupported`, and the content
    term `route_score="tokens"`, which only the reference computes."""
    if config.route_score != "mean":
        return (f"model.attention.route_score={config.route_score!r} (the kernel scores cells by their mean key "
                "only)")
    return routing_unsupported(q.dtype, q.shape[-1], config)


def summarize_cells(k: torch.Tensor, config: FreeSoloConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """What routing reads of the keys: the complete cells' mean key kbar `[Bt, H, C, d]` and largest key
    norm a `[Bt, H, C]` (head-major, no gradient), `C = N // cell_size`, computed by the implementation
    `select_cells` would take for these keys and settings, so that routing from them
    (`select_cells_from_summaries`) gives `select_cells`' cells exactly. A cell's summaries read only
    its own keys: a sequence-parallel rank summarizes its slice and gathers the others'.
    """
    kernel = kernel_for("cell_routing", "cell_summaries", config.impl, k,
                        routing_unsupported(k.dtype, k.shape[-1], config))
    if kernel is not None:
        return kernel(k, config.cell_size)
    return summaries_by_head(k, config.cell_size)


def select_cells_from_summaries(q: torch.Tensor, kbar: torch.Tensor, a: torch.Tensor, config: FreeSoloConfig,
                                prior: RoutingPrior, *, q_start: int = 0) -> torch.Tensor:
    """`select_cells` (variants "fs", "fsl") from the keys' summaries instead of the keys: q `[Bt, n, H, d]`
    at positions `[q_start, q_start + n)` (q_start a multiple of block_size), kbar `[Bt, H, C, d]` and
    a `[Bt, H, C]` from `summarize_cells` of the complete cells of `[0, q_start + n)` ->
    `[Bt, n, H, top_k]`, no gradient."""
    if config.variant not in ("fs", "fsl"):
        raise ValueError(f"routing from summaries serves the variants 'fs' and 'fsl', got {config.variant!r}")
    if config.route_score != "mean":
        raise ValueError(f"model.attention.route_score={config.route_score!r} scores cells by their token keys, "
                         "which the summaries do not hold: route with select_cells")
    if q.dim() != 4 or q_start < 0 or q_start % config.block_size:
        raise ValueError(f"q must be [Bt, n, H, d] at a q_start that is a multiple of "
                         f"block_size={config.block_size}, got {tuple(q.shape)} at q_start={q_start}")
    kernel = kernel_for("cell_routing", "select_cells_from_summaries", config.impl, q,
                        routing_unsupported(q.dtype, q.shape[-1], config))
    if kernel is not None:
        return kernel(q.detach(), kbar, a, config, prior, q_start=q_start)
    return select_cells_from_summaries_reference(q.detach(), kbar, a, config, prior, q_start=q_start)


def cell_readout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cells: torch.Tensor, config: FreeSoloConfig, *,
                 rms_weight: torch.Tensor | None = None, eps: float = READOUT_EPS, q_start: int = 0,
                 chunk: int | None = None) -> torch.Tensor:
    """Long-range readout of the selected cells (docs/freesolo.md §1.6, Eq. 9) -> `[Bt, N, H, d]` in q's dtype.

    q, k, v: unrotated `[Bt, N, H, d]`; cells: `[Bt, N, H, K]` cell indices, -1 =
    none (any order; a cell listed twice is read twice, `select_cells` never
    lists one twice; only complete cells `c < N // cell_size` exist). One softmax jointly over all tokens of the
    selected cells with NoPE logits `q_i . k_j / sqrt(d)`, then RMSNorm over d in fp32:
    `LR_i = g * y_i / sqrt(mean(y_i^2) + eps)`, gain `rms_weight` `[H, d]` or
    `[d]` ([choice] one per layer and head; None = 1). Rows with nothing
    selected are exactly 0, with finite gradients. Tokens are not deduplicated
    against the local window. Gradients reach q, k, v and rms_weight. Reads
    `config.cell_size` and `config.impl`.

    q_start: q and cells hold only the queries of positions `[q_start, q_start + n)`,
    k and v the keys of `[0, q_start + n)`; the result is `[Bt, n, H, d]`.

    chunk: the reference's queries per chunk (`fsframework.ops.freesolo_readout.chunk_queries`); a row of
    laid-out documents passes that of the packed rows, so a chunk's union of cells spans as few documents
    as theirs (`fsframework.ops.freesolo_documents`).
    """
    cell_size = config.cell_size
    check_readout_args(q, k, v, cells, cell_size=cell_size, rms_weight=rms_weight, q_start=q_start)
    kernel = kernel_for("cell_readout", "cell_readout", config.impl, q,
                        readout_unsupported(q.dtype, q.shape[-1], top_k=cells.shape[-1], cell_size=cell_size))
    if kernel is None:  # the range check reads the cells (a device sync): reference only
        check_readout_args(q, k, v, cells, cell_size=cell_size, rms_weight=rms_weight, q_start=q_start,
                           values=True)
    else:
        # the kernel reads out only the given queries
        return kernel(q, k, v, cells, config, rms_weight=rms_weight, eps=eps, q_start=q_start)
    return readout_norm(selected_cell_attention(q, k, v, cells, cell_size, chunk), rms_weight, eps).to(q.dtype)


def cell_readout_kept(q: torch.Tensor, k_cells: torch.Tensor, v_cells: torch.Tensor, cells: torch.Tensor, *,
                      rms_weight: torch.Tensor | None = None, eps: float = READOUT_EPS) -> torch.Tensor:
    """`cell_readout` over the cells a decode cache keeps -> `[Bt, n, H, d]` in q's dtype, no gradient.

    q `[Bt, n, H, d]` (unrotated); k_cells, v_cells `[Bt, H, C', s, d]` cell-major (every cell
    of a head-major archive, or FS-L's candidate cells); cells `[Bt, n, H, K]` index C' (-1 = none).
    The same softmax (`attend_cell_rows`) and RMSNorm as the whole-sequence readout.
    """
    return readout_norm(read_cell_rows(q, k_cells, v_cells, cells), rms_weight, eps).to(q.dtype)


def readout_norm(y: torch.Tensor, rms_weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The readout's RMSNorm over d (docs/freesolo.md §1.6), in y's dtype: `g * y / sqrt(mean(y^2) + eps)`.
    Zero rows stay exactly 0."""
    y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps)
    if rms_weight is not None:
        y = y * rms_weight.to(y.dtype)  # [H, d] and [d] both broadcast over [Bt, N, H, d]
    return y


def unit_gradient_gain(read: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """`gain * read` in the forward pass; in the backward pass `read` gets the gradient it
    would get at gain 1, and `gain` its true gradient `sum(grad * read)` (docs/freesolo.md §1.6,
    `readout_backward=unit`). read `[..., H, d]`, gain `[H, d]` or `[d]`. Plain autograd:
    `read + (gain - 1) * read.detach()` equals `gain * read` up to rounding."""
    return read + (gain.to(read.dtype) - 1) * read.detach()


def long_range_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: FreeSoloConfig,
                         prior: RoutingPrior, *, rms_weight: torch.Tensor | None = None, eps: float = READOUT_EPS,
                         q_start: int = 0) -> torch.Tensor:
    """FreeSolo long-range branch: `cell_readout(q, k, v, select_cells(q, k, ...))` -> `[Bt, N, H, d]`.

    See `select_cells` (routing, FS or FS-L, no gradient) and `cell_readout`
    (NoPE joint softmax over the selected tokens, then per-head RMSNorm).
    q_start (a multiple of block_size): queries of positions `[q_start, q_start + n)`
    only, over keys/values of `[0, q_start + n)` -> `[Bt, n, H, d]` (sequence parallelism).
    """
    check_qkv(q, k, v, q_start=q_start, block_size=config.block_size)
    cells = select_cells(q, k, config, prior, q_start=q_start)
    return cell_readout(q, k, v, cells, config, rms_weight=rms_weight, eps=eps, q_start=q_start)
