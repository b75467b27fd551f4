"""Argument checks shared by the kernels and the PyTorch references in `fsframework.ops`.

Torch only (no Triton import), so the references can use these checks on a
machine without Triton; each check raises ValueError naming the problem.
Legend: B batch, N tokens, H heads, d head width, K cells per query.
"""

from __future__ import annotations

import torch

VARIANTS = ("fs", "fsl")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_head_dim(name: str, x: torch.Tensor, even: bool = False) -> None:
    """Raise ValueError unless `x` has a dtype and head dim the kernels support."""
    if x.dtype not in DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    d = x.shape[-1]
    if d < 1 or d > 256:
        raise ValueError(f"{name}: head dim must be in [1, 256], got {d}")
    if even and d % 2:
        raise ValueError(f"{name}: RoPE needs an even head dim, got {d}")


def check_query_offset(q: torch.Tensor, k: torch.Tensor, q_start: int, block_size: int) -> None:
    """Queries `[Bt, n, H, d]` at positions `[q_start, q_start + n)` against keys `[Bt, q_start + n, H, d]`."""
    if q_start < 0 or q_start % block_size:
        raise ValueError(f"q_start={q_start} must be a non-negative multiple of block_size={block_size} "
                         "(a query block never straddles a slice boundary)")
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] \
            or k.shape[1] != q_start + q.shape[1]:
        raise ValueError(f"with q_start={q_start}, q [B, n, H, d] needs keys [B, q_start + n, H, d], got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")


def check_summaries(q: torch.Tensor, kbar: torch.Tensor, a: torch.Tensor, *, cell_size: int, q_start: int) -> None:
    """Routing from summaries: q `[B, n, H, d]` at `[q_start, q_start + n)` needs kbar `[B, H, C, d]` and
    a `[B, H, C]` of the `C` complete cells of `[0, q_start + n)`."""
    bsz, num, heads, dim = q.shape
    num_cells = (q_start + num) // cell_size
    if kbar.shape != (bsz, heads, num_cells, dim) or a.shape != (bsz, heads, num_cells):
        raise ValueError(f"summaries of the {num_cells} complete cells of [0, {q_start + num}) must be kbar "
                         f"{(bsz, heads, num_cells, dim)} and a {(bsz, heads, num_cells)}, got {tuple(kbar.shape)} "
                         f"and {tuple(a.shape)}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, q_start: int, block_size: int) -> None:
    """q, k, v `[B, N, H, d]` of one shape; with `q_start` (a multiple of `block_size`), q `[B, n, H, d]` and
    k, v `[B, q_start + n, H, d]`."""
    if q_start:
        check_query_offset(q, k, q_start, block_size)
        if k.shape != v.shape:
            raise ValueError(f"k and v must share a shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    elif q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must share a [B, N, H, d] shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")


def check_routing_args(q: torch.Tensor, k: torch.Tensor, config, *, q_start: int = 0) -> None:
    """Cell routing (FS / FS-L): shapes of q, k `[B, N, H, d]` and the sizes of `config` (a
    `fsframework.ops.freesolo_config.FreeSoloConfig`: variant, cell_size, block_size, top_k,
    recent_cells, retained_cells)."""
    variant, cell_size, block_size = config.variant, config.cell_size, config.block_size
    top_k, recent_cells, retained_cells = config.top_k, config.recent_cells, config.retained_cells
    if q_start:
        check_query_offset(q, k, q_start, block_size)
    elif q.dim() != 4 or q.shape != k.shape:
        raise ValueError(f"q and k must share a [B, N, H, d] shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[-1] < 1:
        raise ValueError(f"head width d must be >= 1, got {q.shape[-1]}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS} (or 'fsb', reference routing only), got {variant!r}")
    if cell_size < 1:
        raise ValueError(f"cell_size must be >= 1, got {cell_size}")
    if block_size < 1 or block_size % cell_size:
        raise ValueError(f"block_size={block_size} must be a positive multiple of cell_size={cell_size}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if recent_cells < 0 or retained_cells < 0:
        raise ValueError(f"recent_cells (W={recent_cells}) and retained_cells (P={retained_cells}) must be >= 0")


def per_head(value: float | torch.Tensor, heads: int, name: str, *, positive: bool, like: torch.Tensor) -> torch.Tensor:
    """A float or a `[H]` (or scalar) tensor -> a `[H]` tensor in `like`'s dtype and device."""
    if isinstance(value, torch.Tensor):
        if value.dim() > 1 or (value.dim() == 1 and value.shape[0] not in (1, heads)):
            raise ValueError(f"{name} must be a float or a tensor of shape ({heads},), got shape {tuple(value.shape)}")
        return value.detach().to(device=like.device, dtype=like.dtype).expand(heads)
    value = float(value)
    if (positive and not value > 0) or value < 0:
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value}")
    return torch.full((heads,), value, device=like.device, dtype=like.dtype)


def prior_per_head(sigma: float | torch.Tensor, lam: float | torch.Tensor, heads: int, *, like: torch.Tensor,
                   batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The constants of Eq. 7's prior `lam_h * a_c * erf((i - p_c) / (2 sigma_h))`: sigma (> 0) and lam
    (>= 0), floats or `[H]` tensors -> (sigma_h, lam_h), contiguous `[H]` tensors in `like`'s dtype and
    device; with `batch`, `[batch * H]`, one per row g = (b, h) (b-major, as FS-B's search lays them)."""
    sigma_h = per_head(sigma, heads, "sigma", positive=True, like=like).contiguous()
    lam_h = per_head(lam, heads, "lam", positive=False, like=like).contiguous()
    if batch is not None:
        sigma_h, lam_h = sigma_h.repeat(batch), lam_h.repeat(batch)
    return sigma_h, lam_h


def check_readout_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cells: torch.Tensor, *, cell_size: int,
                       rms_weight: torch.Tensor | None, q_start: int = 0, values: bool = False) -> None:
    """Selected-cell readout: shapes of q, k, v, cells `[B, n, H, K]` and rms_weight, and cell_size.

    With `values`, also the range of `cells` (-1 or a complete cell `< N // cell_size`):
    that reads the tensor (a device sync), so only the reference asks for it.
    """
    check_qkv(q, k, v, q_start=q_start, block_size=1)  # the readout reads queries from any position
    if cell_size < 1:
        raise ValueError(f"cell_size must be >= 1, got {cell_size}")
    if cells.dim() != 4 or cells.shape[:3] != q.shape[:3] or cells.shape[3] < 1:
        raise ValueError(f"cells must have shape [B, N, H, K] = {tuple(q.shape[:3])} + (K,), K >= 1, "
                         f"got {tuple(cells.shape)}")
    if cells.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cells must be an integer tensor (int64 or int32), got {cells.dtype}")
    num_cells = k.shape[1] // cell_size
    if values and cells.numel() and (int(cells.min()) < -1 or int(cells.max()) >= num_cells):
        raise ValueError(f"cells must lie in [-1, {num_cells - 1}] (-1 = none; only complete cells of "
                         f"N={q.shape[1]}, s={cell_size} exist), got [{int(cells.min())}, {int(cells.max())}]")
    heads, dim = q.shape[2], q.shape[3]
    if rms_weight is not None and tuple(rms_weight.shape) not in ((heads, dim), (dim,)):
        raise ValueError(f"rms_weight must have shape ({heads}, {dim}) or ({dim},), got {tuple(rms_weight.shape)}")


def check_window_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> None:
    """Sliding-window attention: q, k, v `[B, T, H, D]` of one shape and `window >= 0`."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must share a [B, T, H, D] shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")


def check_document_positions(positions: torch.Tensor, x: torch.Tensor, start_pos: int = 0) -> None:
    """Packed documents' positions for `x` `[B, T, ...]`: an integer `[B, T]` tensor on x's device, each
    token's position inside its document (0 at a document's start, +1 per token within it; a row's
    first token starts a document), and `start_pos` 0 (the positions say where every token is).

    The values are read only off CUDA: reading them there would make the host wait for the device.
    """
    if start_pos:
        raise ValueError(f"start_pos must be 0 when positions are given (they place every token), got {start_pos}")
    if positions.shape != x.shape[:2]:
        raise ValueError(f"positions must be [B, T] = {list(x.shape[:2])}, got shape {tuple(positions.shape)}")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise ValueError(f"positions must be an integer tensor (int64), got {positions.dtype}")
    if positions.device != x.device:
        raise ValueError(f"positions must be on the inputs' device {x.device}, got {positions.device}")
    if positions.device.type == "cuda" or positions.numel() == 0:
        return
    if (positions[:, 0] != 0).any():
        row = int((positions[:, 0] != 0).nonzero()[0, 0])
        raise ValueError(f"positions: a row's first token starts a document (position 0), row {row} has "
                         f"{int(positions[row, 0])}")
    prev, cur = positions[:, :-1], positions[:, 1:]
    bad = (cur != 0) & (cur != prev + 1)
    if bad.any():
        row, t = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"positions[{row}, {t + 1}] = {int(cur[row, t])}: a token's position is 0 (a document "
                         f"starts) or one more than the token before's ({int(prev[row, t]) + 1})")


def check_first_cells(first_cells: torch.Tensor, seq: int, config, q_start: int) -> list[int]:
    """Documents laid end to end, each from a query-block boundary (`fsframework.ops.freesolo_documents`;
    config: a `FreeSoloConfig`, its cell_size and block_size):
    `first_cells` `[NB]` (on the CPU: the routing loops read it) holds, for each query block of the
    rows, the first cell of the document that block belongs to, the same for every row. A block then
    reads only the cells of its own document, `[first, b / s)`, as the document read alone from its
    start would (positions enter the prior only as `i - p_c`, and the document starts at a multiple
    of the cell size). Returns it as a list; ValueError when it does not fit."""
    blocks = -(-seq // config.block_size)
    if q_start or first_cells.device.type != "cpu" or tuple(first_cells.shape) != (blocks,):
        raise ValueError(f"first_cells must be a CPU tensor [{blocks}] (one per query block of the whole rows, "
                         f"q_start 0), got {tuple(first_cells.shape)} on {first_cells.device} at q_start={q_start}")
    firsts = first_cells.tolist()
    per_block = config.block_size // config.cell_size
    if any(f < 0 or f % per_block or f > j * per_block or (j and f < firsts[j - 1]) for j, f in enumerate(firsts)):
        raise ValueError(f"first_cells must be block-aligned first cells, none after its block's start and never "
                         f"decreasing, got {firsts}")
    return firsts

