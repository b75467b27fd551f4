"""Selected-cell softmax readout (docs/freesolo.md §1.6, Eq. 9, before the RMSNorm), reference implementation.

Legend: Bt batch, N tokens, H heads, d head width, K cells per query, s cell
size, C = N // s complete cells, n queries of one chunk, U cells of a chunk's union.

    y_i = sum_{j in S_i} softmax_j(q_i . k_j / sqrt(d)) v_j,   S_i = tokens of the selected cells

A custom autograd function walks the queries in chunks, in the forward pass
and again in the backward pass (recomputing the logits from the saved
log-sum-exp instead of saving `[N, K*s]` probabilities), so peak memory is
`O(N H d)` plus one chunk. Each chunk uses one of two exact layouts:

- union: the cells selected by any query of the chunk are gathered once per
  head and every query of the chunk attends to their tokens through a dense
  matmul, with a mask that keeps only its own cells. Chosen when the union is
  small (FS-L: at most P + W cells per block), because a matmul over a few
  masked extra keys is far cheaper than per-query gathers.
- gather: every query gathers its own `K * s` keys and values (FS over a long
  prefix, where the union of a chunk approaches `n * K` cells).

Both layouts are the same computation: queries grouped as `[Bt, H, G, m, d]`
against keys `[Bt, H, G, L, d]` (union: G = 1, m = n; gather: G = n, m = 1).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

# elements of one gathered K/V chunk (~16 MB in fp32): bounds readout memory independently of N
_CHUNK_ELEMENTS = 1 << 22
# a union of up to _UNION_FACTOR * K cells is read densely; a per-query gather costs roughly that much more
_UNION_FACTOR = 16


def _cell_major(x: torch.Tensor, cell_size: int, acc: torch.dtype) -> torch.Tensor:
    """`[Bt, N, H, d]` -> `[Bt*H*C, s*d]` rows, one row per (batch, head, cell), in `acc` dtype."""
    bsz, seq, heads, dim = x.shape
    num_cells = seq // cell_size
    xc = x[:, : num_cells * cell_size].view(bsz, num_cells, cell_size, heads, dim)
    return xc.permute(0, 3, 1, 2, 4).to(acc).reshape(bsz * heads * num_cells, cell_size * dim)


def _token_major(rows: torch.Tensor, like: torch.Tensor, cell_size: int) -> torch.Tensor:
    """Inverse of `_cell_major` -> `[Bt, N, H, d]` in like's dtype, zeros for the incomplete tail."""
    bsz, seq, heads, dim = like.shape
    num_cells = seq // cell_size
    out = torch.zeros(like.shape, dtype=like.dtype, device=like.device)
    if num_cells:
        out[:, : num_cells * cell_size] = (rows.view(bsz, heads, num_cells, cell_size, dim)
                                           .permute(0, 2, 3, 1, 4).reshape(bsz, num_cells * cell_size, heads, dim))
    return out


def _plan(cells: torch.Tensor, num_cells: int):
    """Layout of one query chunk; `cells` `[Bt, n, H, K]` (-1 = none).

    Returns `rows` `[Bt, H, G, Cg]` (rows of `_cell_major` tensors to read),
    `member` `[Bt, H, G, m, Cg]` (query reads that cell) and `bias` (None, or
    `log(times listed)` of the same shape when a query lists a cell twice), or
    None when a chunk of several queries selects nothing.
    """
    bsz, num, heads, top_k = cells.shape
    cells = cells.permute(0, 2, 1, 3).long()  # Bt H n K
    base = torch.arange(bsz * heads, device=cells.device).view(bsz, heads) * num_cells  # Bt H: (b H + h) C
    if num == 1:  # one query (a chunk of one, with its lse): its own cells are the union, no need to find it
        return base[:, :, None, None] + cells.clamp_min(0), (cells >= 0)[:, :, :, None], None
    flat = cells.reshape(bsz, heads, num * top_k).sort(dim=-1).values
    first = flat >= 0
    first[..., 1:] &= flat[..., 1:] != flat[..., :-1]
    width = int(first.sum(dim=-1).max())  # largest union over (batch, head)
    if width == 0:
        return None
    if width <= _UNION_FACTOR * top_k:
        slot = torch.where(first, first.cumsum(dim=-1) - 1, width)
        union = torch.full((bsz, heads, width + 1), -1, dtype=torch.long, device=cells.device)
        union = union.scatter_(-1, slot, flat)[..., :width]  # Bt H U, padded with -1
        count = (cells[..., None] == union[:, :, None, None, :]).sum(dim=-2) * (union >= 0)[:, :, None]
        # a cell listed twice is read twice, as the gather layout does: weight its keys by the count
        bias = torch.log(count.clamp_min(1).to(torch.float64))[:, :, None] if bool((count > 1).any()) else None
        return (base[..., None] + union.clamp_min(0))[:, :, None], (count > 0)[:, :, None], bias  # G = 1, m = n
    rows = base[:, :, None, None] + cells.clamp_min(0)  # Bt H n K: G = n, each query its own cells
    return rows, (cells >= 0)[:, :, :, None], None  # m = 1


def _logits(q_g, k_rows, rows, member, bias, cell_size, scale):
    """Logits `[Bt, H, G, m, L]`, the keys a query does NOT read (bool, same shape) and keys
    `[Bt, H, G, L, d]`; L = Cg * s."""
    dim = q_g.shape[-1]
    # F.embedding is a much faster row gather than advanced indexing on CPU; -1 cells read row 0, masked
    keys = F.embedding(rows, k_rows).view(*rows.shape[:3], -1, dim).to(q_g.dtype)
    logits = torch.matmul(q_g, keys.transpose(-1, -2)) * scale
    if bias is not None:
        logits += bias.to(logits.dtype)[..., None].expand(*bias.shape, cell_size).flatten(-2)
    skip = ~member  # inverted on the cell-level mask, before it is expanded to tokens
    return logits, skip[..., None].expand(*skip.shape, cell_size).flatten(-2), keys


def _probs(logits: torch.Tensor, skip: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """`exp(logits - shift)`, 0 where `skip`. Skipped entries go through exp(0), not exp(-inf):
    vectorised exp is an order of magnitude slower on -inf."""
    return torch.exp((logits - shift).masked_fill_(skip, 0.0)).masked_fill_(skip, 0.0)


def _group(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Chunk `[Bt, n, H, d]` -> `[Bt, H, G, m, d]` for the layout of `rows` `[Bt, H, G, Cg]`."""
    bsz, num, heads, dim = x.shape
    return x.permute(0, 2, 1, 3).reshape(bsz, heads, rows.shape[2], num // rows.shape[2], dim)


def _ungroup(x: torch.Tensor) -> torch.Tensor:
    """`[Bt, H, G, m, d]` -> `[Bt, n, H, d]`."""
    return x.flatten(2, 3).transpose(1, 2)


def attend_cell_rows(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, cells: torch.Tensor,
                     num_cells: int, cell_size: int, with_lse: bool = True,
                     chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The readout's forward pass over cell rows: `y [Bt, n, H, d]` and its log-sum-exp `[Bt, n, H]` (acc dtype;
    None unless `with_lse`: only the backward pass reads it).

    q `[Bt, n, H, d]`; k_rows, v_rows `[Bt*H*C', s*d]`, one row per (batch row, head, cell) in
    any dtype (only the gathered rows are converted); cells `[Bt, n, H, K]` indices into the C'
    cells of each (batch row, head), -1 = none. Whole-sequence readout (`SelectedCellAttention`)
    and a decode cache's (`read_cell_rows`) both run it. `chunk`: queries per chunk (`_chunks`).
    """
    bsz, seq, heads, dim = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    if seq == 1 and num_cells and not with_lse:
        return _attend_one_query(q, k_rows, v_rows, cells, num_cells, cell_size, acc), None
    chunks = _chunks(cells, num_cells, cell_size, dim, chunk) if num_cells else iter(())
    first = next(chunks, None)
    if first is not None and first[:2] == (0, seq):  # one chunk holds every query (a short piece)
        return _attend_chunk(q, k_rows, v_rows, *first, cell_size=cell_size, acc=acc, with_lse=with_lse)
    y = torch.zeros((bsz, seq, heads, dim), dtype=acc, device=q.device)
    lse = torch.zeros((bsz, seq, heads), dtype=acc, device=q.device) if with_lse else None
    for start, end, *plan in itertools.chain(() if first is None else (first,), chunks):
        y[:, start:end], lse_chunk = _attend_chunk(q, k_rows, v_rows, start, end, *plan, cell_size=cell_size,
                                                   acc=acc, with_lse=with_lse)
        if with_lse:
            lse[:, start:end] = lse_chunk
    return y, lse


def _attend_one_query(q, k_rows, v_rows, cells, num_cells, cell_size, acc):
    """`attend_cell_rows` for one query per (batch row, head), a decoded token, without its lse: its
    `K s` keys gathered and one fused attention call with a mask over the cells it does not read (a
    third of the ops of the chunk path, which a token would otherwise dispatch in every layer)."""
    bsz, _, heads, dim = q.shape
    top_k = cells.shape[-1]
    cells = cells[:, 0]  # Bt H K
    rows = (torch.arange(bsz * heads, device=q.device).view(bsz, heads, 1) * num_cells + cells.clamp_min(0))
    keys, values = (F.embedding(rows, x).view(bsz, heads, top_k * cell_size, dim).to(acc) for x in (k_rows, v_rows))
    read = cells >= 0
    mask = read[..., None].expand(bsz, heads, top_k, cell_size).reshape(bsz, heads, 1, top_k * cell_size)
    y = F.scaled_dot_product_attention(q.transpose(1, 2).to(acc), keys, values, attn_mask=mask)  # Bt H 1 d
    # a query without a cell reads 0 (the chunk path's rule; a fused call may give NaN there)
    return torch.where(read.any(dim=-1)[..., None, None], y, 0.0).transpose(1, 2)


def _attend_chunk(q, k_rows, v_rows, start, end, rows, member, bias, *, cell_size, acc, with_lse):
    """`attend_cell_rows` for the queries `[start, end)` of one chunk and its plan (`_chunks`): y `[Bt, n, H, d]`
    and the log-sum-exp `[Bt, n, H]` (None unless `with_lse`)."""
    dim = q.shape[-1]
    q_g = _group(q[:, start:end].to(acc), rows)
    logits, skip, _ = _logits(q_g, k_rows, rows, member, bias, cell_size, 1.0 / math.sqrt(dim))
    # rows without any key keep a finite max and a zero sum: y = 0, no NaN
    row_max = logits.masked_fill(skip, float("-inf")).amax(dim=-1, keepdim=True)
    row_max = row_max.clamp_min(torch.finfo(acc).min)
    p = _probs(logits, skip, row_max)
    total = p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(acc).tiny)
    values = F.embedding(rows, v_rows).view(*rows.shape[:3], -1, dim).to(acc)
    y = _ungroup(torch.matmul(p / total, values))
    return y, _ungroup(row_max + torch.log(total)).squeeze(-1) if with_lse else None


class SelectedCellAttention(torch.autograd.Function):
    """`y [Bt, N, H, d]` (acc dtype) from q, k, v `[Bt, N, H, d]` and cells `[Bt, N, H, K]`.

    Rows with no selected cell give `y_i = 0` and zero gradients. Saves q, k, v,
    cells, y and the per-row log-sum-exp; the backward pass gathers again.
    """

    @staticmethod
    def forward(ctx, q, k, v, cells, cell_size, chunk=None):
        acc = torch.promote_types(q.dtype, torch.float32)
        num_cells = k.shape[1] // cell_size  # k may extend before q (queries of a later slice)
        y, lse = attend_cell_rows(q, _cell_major(k, cell_size, acc), _cell_major(v, cell_size, acc), cells,
                                  num_cells, cell_size, chunk=chunk)
        ctx.save_for_backward(q, k, v, cells, y, lse)
        ctx.cell_size, ctx.chunk = cell_size, chunk
        return y

    @staticmethod
    def backward(ctx, grad_y):
        q, k, v, cells, y, lse = ctx.saved_tensors
        cell_size = ctx.cell_size
        bsz, seq, heads, dim = q.shape
        acc, scale = y.dtype, 1.0 / math.sqrt(dim)
        num_cells = k.shape[1] // cell_size
        dq = torch.zeros_like(y)
        dk_rows = torch.zeros((bsz * heads * num_cells, cell_size * dim), dtype=acc, device=q.device)
        dv_rows = torch.zeros_like(dk_rows)
        if num_cells > 0:
            k_rows, v_rows = _cell_major(k, cell_size, acc), _cell_major(v, cell_size, acc)
            grad_y = grad_y.to(acc)
            for start, end, rows, member, bias in _chunks(cells, num_cells, cell_size, dim, ctx.chunk):
                q_g = _group(q[:, start:end].to(acc), rows)
                logits, skip, keys = _logits(q_g, k_rows, rows, member, bias, cell_size, scale)
                p = _probs(logits, skip, _group(lse[:, start:end, :, None], rows))
                values = F.embedding(rows, v_rows).view(*rows.shape[:3], -1, dim)
                dy = _group(grad_y[:, start:end], rows)
                dp = torch.matmul(dy, values.transpose(-1, -2))
                delta = (dy * _group(y[:, start:end], rows)).sum(dim=-1, keepdim=True)  # = sum_j p_j dp_j
                dlogits = p * (dp - delta) * scale
                dq[:, start:end] = _ungroup(torch.matmul(dlogits, keys))
                flat = rows.reshape(-1)  # no duplicates within a union; gathers may repeat a cell
                dk_rows.index_add_(0, flat, torch.matmul(dlogits.transpose(-1, -2), q_g).view(flat.shape[0], -1))
                dv_rows.index_add_(0, flat, torch.matmul(p.transpose(-1, -2), dy).view(flat.shape[0], -1))
        return (dq.to(q.dtype), _token_major(dk_rows, k, cell_size), _token_major(dv_rows, v, cell_size),
                None, None, None)


def chunk_queries(bsz: int, heads: int, top_k: int, cell_size: int, dim: int) -> int:
    """Queries per readout chunk for `bsz` rows: one chunk's gathered keys and values stay within
    `_CHUNK_ELEMENTS`."""
    return max(1, _CHUNK_ELEMENTS // (bsz * heads * top_k * cell_size * dim))


def _chunks(cells: torch.Tensor, num_cells: int, cell_size: int, dim: int, chunk: int | None = None):
    """Yield `(start, end, rows, member, bias)` for every query chunk (`chunk` queries, `chunk_queries`
    by default) that selects at least one cell."""
    bsz, seq, heads, top_k = cells.shape
    chunk = chunk or chunk_queries(bsz, heads, top_k, cell_size, dim)
    for start in range(0, seq, chunk):
        end = min(start + chunk, seq)
        plan = _plan(cells[:, start:end], num_cells)
        if plan is not None:
            yield start, end, *plan


def selected_cell_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cells: torch.Tensor,
                            cell_size: int, chunk: int | None = None) -> torch.Tensor:
    """Softmax readout of the selected cells before the RMSNorm, `[Bt, N, H, d]` in fp32 (fp64 kept);
    `chunk` queries at a time (`chunk_queries` by default)."""
    return SelectedCellAttention.apply(q, k, v, cells, cell_size, chunk)


def read_cell_rows(q: torch.Tensor, k_cells: torch.Tensor, v_cells: torch.Tensor,
                   cells: torch.Tensor) -> torch.Tensor:
    """`selected_cell_attention` over keys/values kept cell-major, `[Bt, H, C', s, d]` each (a decode
    cache's archive or candidate cells; contiguous per (batch row, head), so the rows are a view);
    cells `[Bt, n, H, K]` index C' (-1 = none). No gradient. -> `[Bt, n, H, d]` in fp32 (fp64 kept)."""
    bsz, heads, num_cells, cell_size, dim = k_cells.shape
    rows = bsz * heads * num_cells
    y, _ = attend_cell_rows(q, k_cells.reshape(rows, cell_size * dim), v_cells.reshape(rows, cell_size * dim),
                            cells, num_cells, cell_size, with_lse=False)
    return y
