"""FreeSolo's long-range branch over cached cell summaries (docs/freesolo.md §1.9, docs/decoding.md).

Plain PyTorch. Legend: Bt batch, n queries, H heads, d head width, M candidate cells,
K top_k, s cell_size.

A decode cache hands its long-range branch one query piece at a time, and a piece never
crosses a query block, so all its queries share one available set (docs/freesolo.md §1.5).
The cache keeps that set as M candidate cells per head (their mean key `kbar`, key-norm
priority `a`, center `p` and raw keys/values), so no layer ever rescans the prefix:

    route_candidates(q, q_start, kbar, a, centers, valid, ...) -> choice [Bt, n, H, K]   (Eq. 7 + top-K)
    read_candidates(q, cells_k, cells_v, choice, ...)            -> LR [Bt, n, H, d]      (Eq. 9 + RMSNorm)
      = read_cells(q, gather_cells(cells_k, choice), gather_cells(cells_v, choice), choice >= 0)

Candidates are listed in cell order among the valid ones, so `top_k_earliest` breaks ties
toward the earlier cell exactly as `select_cells_reference` does; the two functions compute
the rows of `select_cells` / `cell_readout` for the same available set (tested against them).
"""

from __future__ import annotations

import math

import torch

from fsframework.ops.freesolo_routing import _prior, per_head, top_k_earliest


def route_candidates(q: torch.Tensor, q_start: int, kbar: torch.Tensor, a: torch.Tensor, centers: torch.Tensor,
                     valid: torch.Tensor | None, *, top_k: int, sigma: float | torch.Tensor,
                     lam: float | torch.Tensor) -> torch.Tensor:
    """Top-K candidates per query and head, best first: positions into M, -1 where fewer are valid.

    q: unrotated `[Bt, n, H, d]` at positions `[q_start, q_start + n)`; kbar `[Bt, H, M, d]`,
    a `[Bt, H, M]` (the summaries' dtype is the score dtype, as in the reference);
    centers: cell centers `(c + 1/2) s`, broadcastable to `[Bt, H, M]`; valid: bool
    `[Bt, H, M]` or None. Scores `q . kbar / sqrt(d) + lam_h a erf((i - p) / (2 sigma_h))`.
    """
    bsz, num, heads, dim = q.shape
    like = torch.empty((), dtype=kbar.dtype, device=q.device)
    sigma_h = per_head(sigma, heads, "sigma", positive=True, like=like)
    lam_h = per_head(lam, heads, "lam", positive=False, like=like)
    with torch.no_grad():  # hard selections receive no gradient (docs/freesolo.md §1.6)
        content = torch.einsum("bqhd,bhmd->bqhm", q.detach().to(kbar.dtype), kbar) * (1.0 / math.sqrt(dim))
        pos = torch.arange(q_start, q_start + num, device=q.device)
        scores = content + _prior(a, centers.expand_as(a), pos, lam_h, sigma_h)
        return top_k_earliest(scores, None if valid is None else valid[:, None], top_k)


def gather_cells(cells: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """cells `[Bt, H, M, s, d]` (any strides: a view of a token-major archive works),
    choice `[Bt, n, H, K]` positions into M (-1 reads position 0; mask it) -> `[Bt, n, H, K, s, d]`."""
    bsz, heads = cells.shape[:2]
    b = torch.arange(bsz, device=cells.device)[:, None, None, None]
    h = torch.arange(heads, device=cells.device)[None, None, :, None]
    return cells[b, h, choice.clamp_min(0)]


def read_cells(q: torch.Tensor, k_sel: torch.Tensor, v_sel: torch.Tensor, selected: torch.Tensor, *,
               rms_weight: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Joint NoPE softmax of each query over the tokens of its selected cells, then RMSNorm -> `[Bt, n, H, d]`.

    q `[Bt, n, H, d]`; k_sel, v_sel `[Bt, n, H, K, s, d]` (`gather_cells`); selected: bool
    `[Bt, n, H, K]`. Rows with nothing selected are exactly 0 (as in `cell_readout`).
    Computed in fp32 at least, returned in q's dtype.
    """
    cell_size = k_sel.shape[-2]
    member = selected[..., None].expand(*selected.shape, cell_size).flatten(-2)
    return _read(q, k_sel.flatten(3, 4), v_sel.flatten(3, 4), member, "bqhd,bqhld->bqhl", "bqhl,bqhld->bqhd",
                 rms_weight, eps)


def read_candidates(q: torch.Tensor, cells_k: torch.Tensor, cells_v: torch.Tensor, choice: torch.Tensor, *,
                    rms_weight: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """`read_cells` of the cells `choice` `[Bt, n, H, K]` picks among candidates `[Bt, H, M, s, d]`.

    Two layouts of one computation: with few candidates for the queries (`M <= n K`: an FS-L
    block, a prefill chunk) every query attends densely to all candidates' tokens with a mask
    that keeps its own cells; otherwise each query gathers its `K s` keys.
    """
    bsz, num, heads, top_k = choice.shape
    num_cand, cell_size = cells_k.shape[2:4]
    if num_cand > num * top_k:
        return read_cells(q, gather_cells(cells_k, choice), gather_cells(cells_v, choice), choice >= 0,
                          rms_weight=rms_weight, eps=eps)
    picked = torch.zeros(bsz, num, heads, num_cand + 1, dtype=torch.bool, device=q.device)
    picked.scatter_(-1, torch.where(choice >= 0, choice, num_cand), True)  # -1 goes to a dump slot
    member = picked[..., :num_cand, None].expand(-1, -1, -1, -1, cell_size).flatten(-2)
    return _read(q, cells_k.flatten(2, 3), cells_v.flatten(2, 3), member, "bqhd,bhld->bqhl", "bqhl,bhld->bqhd",
                 rms_weight, eps)


def _read(q, keys, values, member, logits_eq, out_eq, rms_weight, eps):
    """The softmax over the `member` tokens, its zero rows, and the RMSNorm (docs/freesolo.md §1.6)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    logits = torch.einsum(logits_eq, q.to(acc), keys.to(acc)) * (1.0 / math.sqrt(q.shape[-1]))
    any_cell = member.any(dim=-1, keepdim=True)
    # a row with nothing selected gets uniform zeros instead of all -inf (NaN), then is zeroed
    logits = logits.masked_fill(~member & any_cell, float("-inf")).masked_fill(~any_cell, 0.0)
    y = torch.einsum(out_eq, torch.softmax(logits, dim=-1), values.to(acc)) * any_cell
    y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps)
    if rms_weight is not None:
        y = y * rms_weight.to(y.dtype)
    return y.to(q.dtype)
