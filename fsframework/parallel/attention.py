"""Sequence-parallel forms of every attention kind: each rank attends for its own queries only.

Legend: B batch, n own queries (positions `[a, b)` of the sequence, `a = sp.start`,
`b = sp.end`), H heads, d head width, w window.

What each kind gathers (queries at absolute positions `[a, b)`):
- TF++ / sinusoidal / ALiBi: K and V of `[0, b)` by one all-gather (as Llama 3
  context parallelism), causal mask by absolute position (`j <= i`). RoPE rotates
  q and k at their absolute positions before the gather; ALiBi's bias uses
  absolute distances.
- SWA: only a halo of the `w` keys/values before `a` (point-to-point).
- FS / FS-L: unrotated K and V of `[0, b)` by one all-gather; the local branch
  reads `[a - w, b)` of it, the long-range branch routes over the cells of
  `[0, b)` (cell summaries are recomputed locally from the gathered keys, so
  they are bit-identical to the single-process ones) and reads selected cells.

Load balancing: slices are contiguous runs of whole query blocks, so later ranks
do more causal attention work than earlier ones (no zigzag); for SWA and the
FreeSolo local and readout branches the work per query is bounded and the load
is balanced; FS routing grows with the prefix like causal attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from fsframework.ops.local_attention import sliding_window_attention
from fsframework.ops.rope import rotate
from fsframework.parallel.collectives import gather_sequence, halo_exchange
from fsframework.parallel.context import SPContext


def gather_kv(k: torch.Tensor, v: torch.Tensor, sp: SPContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Own `k, v` `[B, n, H, d]` -> `[B, b, H, d]` each, in ONE collective (k and v concatenated on d)."""
    kv = gather_sequence(torch.cat((k, v), dim=-1), sp)
    return kv.split(k.shape[-1], dim=-1)


def causal_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """Causal softmax attention of queries at positions `[start, start + n)` over keys `[0, start + n)`.

    q `[B, n, H, d]`, k/v `[B, start + n, H, d]`, optional additive `bias` `[H, n, start + n]`.
    """
    n, total = q.shape[1], k.shape[1]
    if total != start + n:
        raise ValueError(f"queries at [{start}, {start + n}) need keys [0, {start + n}), got {total}")
    if bias is None:
        # j <= i + start: a bottom-right aligned causal mask, which SDPA runs on its fused kernels
        # (an explicit boolean mask falls back to the slower unfused path)
        mask = causal_lower_right(n, total)
    else:
        i = torch.arange(start, start + n, device=q.device)[:, None]
        j = torch.arange(total, device=q.device)[None, :]
        mask = (bias.to(q.dtype).masked_fill(j > i, float("-inf")))[None]
    # B T H D -> B H T D for SDPA, and back
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return y.transpose(1, 2)


class SPRopeAttention:
    """TF++ attention (RoPE, full causal) for the own query slice."""

    def attend(self, q, k, v):
        sp: SPContext = self._sp
        theta = self.cfg.attention.rope_theta
        k, v = gather_kv(rotate(k, theta, sp.start), v, sp)
        return causal_attention_at(rotate(q, theta, sp.start), k, v, sp.start)


class SPNoPositionAttention:
    """Plain causal attention (sinusoidal model) for the own query slice."""

    def attend(self, q, k, v):
        sp: SPContext = self._sp
        k, v = gather_kv(k, v, sp)
        return causal_attention_at(q, k, v, sp.start)


def alibi_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, slopes: torch.Tensor,
                       chunk: int) -> torch.Tensor:
    """ALiBi attention of queries at `[start, start + n)` over keys `[0, start + n)`, `chunk`
    queries at a time so the bias never exceeds `H x chunk x keys`."""
    out = []
    for lo in range(0, q.shape[1], chunk):
        hi = min(lo + chunk, q.shape[1])
        i = torch.arange(start + lo, start + hi, device=q.device)[:, None]
        j = torch.arange(0, start + hi, device=q.device)[None, :]
        bias = -slopes.to(q.dtype)[:, None, None] * (i - j).to(q.dtype)  # H, n, keys
        out.append(causal_attention_at(q[:, lo:hi], k[:, : start + hi], v[:, : start + hi], start + lo, bias=bias))
    return torch.cat(out, dim=1)


class SPAlibiAttention:
    """ALiBi attention for the own query slice, chunked over queries like the single-process module."""

    def attend(self, q, k, v):
        sp: SPContext = self._sp
        k, v = gather_kv(k, v, sp)
        return alibi_attention_at(q, k, v, sp.start, self.slopes, self.chunk)


def window_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, *, window: int,
                        rope_theta: float | None, impl: str) -> torch.Tensor:
    """Sliding-window attention of queries at `[start, start + n)` over keys `[start - h, start + n)`.

    q `[B, n, H, d]`; k/v `[B, h + n, H, d]` with `h = k.shape[1] - n` halo keys (h >= min(window, start)).
    The halo positions get zero queries whose outputs are dropped: the reference op
    takes equal-length q/k/v, and the extra work is bounded by the window.
    """
    halo = k.shape[1] - q.shape[1]
    q_pad = torch.cat((q.new_zeros((q.shape[0], halo, *q.shape[2:])), q), dim=1)
    out = sliding_window_attention(q_pad, k, v, window=window, rope_theta=rope_theta, start_pos=start - halo,
                                   impl=impl)
    return out[:, halo:]


class SPSlidingWindowAttention:
    """SWA for the own query slice: a halo of `window` keys/values from the earlier ranks."""

    def attend(self, q, k, v):
        sp: SPContext = self._sp
        a = self.cfg.attention
        dim = k.shape[-1]
        halo = halo_exchange(torch.cat((k, v), dim=-1), sp, a.window)  # B h H 2d
        k = torch.cat((halo[..., :dim], k), dim=1)
        v = torch.cat((halo[..., dim:], v), dim=1)
        return window_attention_at(q, k, v, sp.start, window=a.window, rope_theta=a.rope_theta, impl=a.impl)


def long_range_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, **kwargs) -> torch.Tensor:
    """FreeSolo long-range branch for queries at `[start, start + n)` over keys/values `[0, start + n)`."""
    from fsframework.ops.freesolo import long_range_attention

    # routing scores only the own query blocks; the cell summaries come from all keys [0, b)
    return long_range_attention(q, k, v, q_start=start, **kwargs)


class SPFreeSoloAttention:
    """FS / FS-L for the own query slice: all-gather of unrotated K/V of `[0, b)`, then both branches."""

    def branches(self, x):
        sp: SPContext = self._sp
        a = self.cfg.attention
        q, k, v = self.project(x)
        k_all, v_all = gather_kv(k, v, sp)  # B b H d
        lo = max(0, sp.start - a.window)
        local = window_attention_at(q, k_all[:, lo:], v_all[:, lo:], sp.start, window=a.window,
                                    rope_theta=a.rope_theta, impl=a.impl)
        long_range = long_range_at(
            q, k_all, v_all, sp.start, rms_weight=self.lr_norm_weight, impl=a.impl, variant=self.cfg.name,
            cell_size=a.cell_size, block_size=a.block_size, top_k=a.top_k, sigma=self.sigma, lam=self.lam,
            recent_cells=a.recent_cells, retained_cells=a.retained_cells)
        return local, long_range
