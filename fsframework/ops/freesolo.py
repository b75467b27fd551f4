"""FreeSolo long-range branch (SPEC §1.3-§1.7): cell routing and selected-cell readout.

Legend: Bt batch, N tokens, H heads, d head width, K top_k, s cell_size,
C = N // s complete cells, L = K * s selected tokens per query and head.

    select_cells(q, k, ...)           -> cells [Bt, N, H, K]  (routing, no gradient)
    cell_readout(q, k, v, cells, ...) -> LR    [Bt, N, H, d]  (NoPE softmax + RMSNorm)
    long_range_attention(q, k, v, ...) = cell_readout(q, k, v, select_cells(q, k, ...))

q, k, v are the UNROTATED projections (no RoPE in routing or readout). The
reference readout is a custom autograd function that gathers the selected
cells chunk by chunk of queries in the forward pass and again in the backward
pass (recomputation instead of saving `[N, L, d]` gathers), so peak memory is
`O(N H d + chunk H L d)`. `impl="auto"` runs the Triton kernels of
`fsf_kernels` on CUDA tensors when they import, the reference elsewhere.
"""

from __future__ import annotations

import importlib
import math

import torch

from fsframework.ops.freesolo_routing import check_routing_args, select_cells_reference

_IMPLS = ("auto", "reference", "triton")
# elements of one gathered K/V chunk (~16 MB in fp32): bounds readout memory independently of N
_CHUNK_ELEMENTS = 1 << 22


def _kernel(module: str, name: str, impl: str, device_tensor: torch.Tensor):
    """The Triton function `fsf_kernels.<module>.<name>`, or None to use the reference."""
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "reference" or (impl == "auto" and not device_tensor.is_cuda):
        return None
    try:
        fn = getattr(importlib.import_module(f"fsf_kernels.{module}"), name)
    except (ImportError, AttributeError) as exc:
        if impl == "triton":
            raise RuntimeError(f"impl='triton' requested but fsf_kernels.{module}.{name} is unavailable ({exc}); "
                               "use impl='reference' or 'auto'") from exc
        return None
    return fn


def select_cells(q: torch.Tensor, k: torch.Tensor, *, variant: str = "fs", cell_size: int = 32,
                 block_size: int = 128, top_k: int = 4, sigma: float | torch.Tensor = 4.0,
                 lam: float | torch.Tensor = 1.0, recent_cells: int = 8, retained_cells: int = 64,
                 impl: str = "auto") -> torch.Tensor:
    """Top-K cells per query and head (SPEC §1.3-§1.6). No gradient flows through it.

    q, k: unrotated `[Bt, N, H, d]`. Cell `c` holds tokens `cs .. cs+s-1`
    (`s = cell_size`); its summaries are the mean key `kbar_c`, the center
    `p_c = (c + 1/2) s` and `a_c = max_{j in cell} ||k_j||_2`. Query `i` may use
    the complete cells with `(c+1)s <= b_i`, `b_i = block_size * floor(i / block_size)`
    (so the first block has none and N need not be a multiple of s or B), scored by

        r_ic = q_i . kbar_c / sqrt(d) + lam_h * a_c * erf((i - p_c) / (2 sigma_h)).

    variant "fs": every eligible cell is available. "fsl": per head, the
    `recent_cells` (W) most recent eligible cells plus the `retained_cells` (P)
    eligible cells of largest `a_c`. sigma (> 0), lam (>= 0): floats or `[H]`
    tensors. [choice] ties in `a_c` and in `r_ic` go to the earlier cell.

    Returns a LongTensor `[Bt, N, H, top_k]`: cell indices in descending score,
    -1 where fewer than `top_k` cells are available.
    """
    kernel = _kernel("cell_routing", "select_cells", impl, q)
    kwargs = dict(variant=variant, cell_size=cell_size, block_size=block_size, top_k=top_k, sigma=sigma, lam=lam,
                  recent_cells=recent_cells, retained_cells=retained_cells)
    if kernel is not None:
        check_routing_args(q, k, variant=variant, cell_size=cell_size, block_size=block_size, top_k=top_k,
                           recent_cells=recent_cells, retained_cells=retained_cells)
        with torch.no_grad():
            return kernel(q.detach(), k.detach(), **kwargs)
    return select_cells_reference(q.detach(), k.detach(), **kwargs)


def _check_readout(q, k, v, cells, cell_size, rms_weight, *, values: bool) -> None:
    """Shape checks; with `values`, also the range of `cells` (a device sync, so reference only)."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must share a [B, N, H, d] shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if cell_size < 1:
        raise ValueError(f"cell_size must be >= 1, got {cell_size}")
    if cells.dim() != 4 or cells.shape[:3] != q.shape[:3] or cells.shape[3] < 1:
        raise ValueError(f"cells must have shape [B, N, H, K] = {tuple(q.shape[:3])} + (K,), K >= 1, "
                         f"got {tuple(cells.shape)}")
    if cells.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cells must be an integer tensor (int64 or int32), got {cells.dtype}")
    num_cells = q.shape[1] // cell_size
    if values and cells.numel() and (int(cells.min()) < -1 or int(cells.max()) >= num_cells):
        raise ValueError(f"cells must lie in [-1, {num_cells - 1}] (-1 = none; only complete cells of "
                         f"N={q.shape[1]}, s={cell_size} exist), got [{int(cells.min())}, {int(cells.max())}]")
    heads, dim = q.shape[2], q.shape[3]
    if rms_weight is not None and tuple(rms_weight.shape) not in ((heads, dim), (dim,)):
        raise ValueError(f"rms_weight must have shape ({heads}, {dim}) or ({dim},), got {tuple(rms_weight.shape)}")


def _cell_major(x: torch.Tensor, cell_size: int, acc: torch.dtype) -> torch.Tensor:
    """`[Bt, N, H, d]` -> `[Bt*H*C, s*d]` rows, one row per (batch, head, cell), in `acc` dtype."""
    bsz, seq, heads, dim = x.shape
    num_cells = seq // cell_size
    xc = x[:, : num_cells * cell_size].view(bsz, num_cells, cell_size, heads, dim)
    return xc.permute(0, 3, 1, 2, 4).to(acc).reshape(bsz * heads * num_cells, cell_size * dim)


def _cell_rows(cells: torch.Tensor, num_cells: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices into `_cell_major` tensors for `cells` `[Bt, n, H, K]`, and the valid mask."""
    bsz, _, heads, _ = cells.shape
    base = (torch.arange(bsz, device=cells.device)[:, None] * heads
            + torch.arange(heads, device=cells.device)[None, :]) * num_cells  # Bt H
    valid = cells >= 0
    return base[:, None, :, None] + cells.long().clamp_min(0), valid  # -1 reads row 0, then is masked


def _chunk_logits(q_c, k_rows, rows, valid, cell_size, scale):
    """Gather the selected keys of a query chunk; masked logits `[Bt, n, H, L]` and keys `[Bt, n, H, L, d]`."""
    bsz, num, heads, dim = q_c.shape
    top_k = rows.shape[-1]
    kg = k_rows[rows].view(bsz, num, heads, top_k * cell_size, dim)
    logits = torch.matmul(kg, q_c[..., None]).squeeze(-1) * scale
    mask = valid[..., None].expand(-1, -1, -1, -1, cell_size).reshape(bsz, num, heads, -1)
    return logits.masked_fill(~mask, float("-inf")), kg


class _SelectedCellAttention(torch.autograd.Function):
    """Unnormalised-by-RMS readout `y_i = sum_{j in S_i} softmax_j(q_i.k_j/sqrt(d)) v_j`, `[Bt, N, H, d]`.

    Rows with no selected cell give `y_i = 0` and zero gradients. Forward saves
    only q, k, v, cells, y and the log-sum-exp per row; backward gathers again.
    """

    @staticmethod
    def forward(ctx, q, k, v, cells, cell_size):
        bsz, seq, heads, dim = q.shape
        acc = torch.promote_types(q.dtype, torch.float32)
        num_cells, top_k = seq // cell_size, cells.shape[-1]
        y = torch.zeros((bsz, seq, heads, dim), dtype=acc, device=q.device)
        lse = torch.zeros((bsz, seq, heads), dtype=acc, device=q.device)
        if num_cells > 0:
            k_rows, v_rows = _cell_major(k, cell_size, acc), _cell_major(v, cell_size, acc)
            chunk = max(1, _CHUNK_ELEMENTS // (bsz * heads * top_k * cell_size * dim))
            scale = 1.0 / math.sqrt(dim)
            for start in range(0, seq, chunk):
                end = min(start + chunk, seq)
                rows, valid = _cell_rows(cells[:, start:end], num_cells)
                logits, _ = _chunk_logits(q[:, start:end].to(acc), k_rows, rows, valid, cell_size, scale)
                # empty rows: a finite max and a zero sum give y = 0 with no NaN
                row_max = logits.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(acc).min)
                p = torch.exp(logits - row_max)
                total = p.sum(dim=-1, keepdim=True)
                vg = v_rows[rows].view(*logits.shape, dim)
                y[:, start:end] = torch.matmul((p / total.clamp_min(torch.finfo(acc).tiny))[..., None, :],
                                               vg).squeeze(-2)
                lse[:, start:end] = (row_max + torch.log(total.clamp_min(torch.finfo(acc).tiny))).squeeze(-1)
        ctx.save_for_backward(q, k, v, cells, y, lse)
        ctx.cell_size = cell_size
        return y

    @staticmethod
    def backward(ctx, grad_y):
        q, k, v, cells, y, lse = ctx.saved_tensors
        cell_size = ctx.cell_size
        bsz, seq, heads, dim = q.shape
        acc = y.dtype
        num_cells, top_k = seq // cell_size, cells.shape[-1]
        dq = torch.zeros_like(y)
        dk_rows = torch.zeros((bsz * heads * num_cells, cell_size * dim), dtype=acc, device=q.device)
        dv_rows = torch.zeros_like(dk_rows)
        if num_cells > 0:
            k_rows, v_rows = _cell_major(k, cell_size, acc), _cell_major(v, cell_size, acc)
            chunk = max(1, _CHUNK_ELEMENTS // (bsz * heads * top_k * cell_size * dim))
            scale = 1.0 / math.sqrt(dim)
            grad_y = grad_y.to(acc)
            for start in range(0, seq, chunk):
                end = min(start + chunk, seq)
                rows, valid = _cell_rows(cells[:, start:end], num_cells)
                q_c = q[:, start:end].to(acc)
                logits, kg = _chunk_logits(q_c, k_rows, rows, valid, cell_size, scale)
                p = torch.exp(logits - lse[:, start:end, :, None])  # masked -inf -> 0
                vg = v_rows[rows].view(*logits.shape, dim)
                dy = grad_y[:, start:end]
                dp = torch.matmul(vg, dy[..., None]).squeeze(-1)
                delta = (dy * y[:, start:end]).sum(dim=-1, keepdim=True)  # = sum_j p_j dp_j
                dlogits = p * (dp - delta) * scale
                dq[:, start:end] = torch.matmul(dlogits[..., None, :], kg).squeeze(-2)
                dkg = dlogits[..., None] * q_c[..., None, :]  # Bt n H L d
                dvg = p[..., None] * dy[..., None, :]
                flat = rows.reshape(-1)
                dk_rows.index_add_(0, flat, dkg.reshape(flat.shape[0], cell_size * dim))
                dv_rows.index_add_(0, flat, dvg.reshape(flat.shape[0], cell_size * dim))
        return dq.to(q.dtype), _token_major(dk_rows, k), _token_major(dv_rows, v), None, None


def _token_major(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Inverse of `_cell_major`: `[Bt*H*C, s*d]` -> `[Bt, N, H, d]`, zeros for the incomplete tail."""
    bsz, seq, heads, dim = like.shape
    num_cells = rows.shape[0] // (bsz * heads) if bsz * heads else 0
    cell_size = rows.shape[1] // dim if dim else 0
    out = torch.zeros(like.shape, dtype=like.dtype, device=like.device)
    if num_cells:
        out[:, : num_cells * cell_size] = (rows.view(bsz, heads, num_cells, cell_size, dim)
                                           .permute(0, 2, 3, 1, 4).reshape(bsz, num_cells * cell_size, heads, dim))
    return out


def cell_readout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cells: torch.Tensor, *, cell_size: int = 32,
                 rms_weight: torch.Tensor | None = None, eps: float = 1e-8, impl: str = "auto") -> torch.Tensor:
    """Long-range readout of the selected cells (SPEC §1.6, Eq. 9) -> `[Bt, N, H, d]` in q's dtype.

    q, k, v: unrotated `[Bt, N, H, d]`; cells: `[Bt, N, H, K]` cell indices, -1 =
    none (any order; only complete cells `c < N // cell_size` exist). One softmax
    jointly over all `K * s` tokens of the selected cells with NoPE logits
    `q_i . k_j / sqrt(d)`, then RMSNorm over d in fp32:
    `LR_i = g * y_i / sqrt(mean(y_i^2) + eps)`, gain `rms_weight` `[H, d]` or
    `[d]` ([choice] one per layer and head; None = 1). Rows with nothing
    selected are exactly 0, with finite gradients. Tokens are not deduplicated
    against the local window. Gradients reach q, k, v and rms_weight.
    """
    kernel = _kernel("cell_readout", "cell_readout", impl, q)
    _check_readout(q, k, v, cells, cell_size, rms_weight, values=kernel is None)
    if kernel is not None:
        return kernel(q, k, v, cells, cell_size=cell_size, rms_weight=rms_weight, eps=eps)
    y = _SelectedCellAttention.apply(q, k, v, cells, cell_size)
    y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps)
    if rms_weight is not None:
        y = y * rms_weight.to(y.dtype)  # [H, d] and [d] both broadcast over [Bt, N, H, d]
    return y.to(q.dtype)


def long_range_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                         rms_weight: torch.Tensor | None = None, eps: float = 1e-8, impl: str = "auto",
                         variant: str = "fs", cell_size: int = 32, block_size: int = 128, top_k: int = 4,
                         sigma: float | torch.Tensor = 4.0, lam: float | torch.Tensor = 1.0, recent_cells: int = 8,
                         retained_cells: int = 64) -> torch.Tensor:
    """FreeSolo long-range branch: `cell_readout(q, k, v, select_cells(q, k, ...))` -> `[Bt, N, H, d]`.

    See `select_cells` (routing, FS or FS-L, no gradient) and `cell_readout`
    (NoPE joint softmax over the selected tokens, then per-head RMSNorm).
    """
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must share a [B, N, H, d] shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    cells = select_cells(q, k, variant=variant, cell_size=cell_size, block_size=block_size, top_k=top_k,
                         sigma=sigma, lam=lam, recent_cells=recent_cells, retained_cells=retained_cells, impl=impl)
    return cell_readout(q, k, v, cells, cell_size=cell_size, rms_weight=rms_weight, eps=eps, impl=impl)
