"""Runway-rewired causal attention (docs/rewired.md): the PyTorch reference and its dispatch.

Legend: B batch, n queries, T keys (= q_start + n), H heads, d head width, bq query tile.

Every head's scaled logits `x_tm = q_t . k_m / sqrt(d)` get one bias shared by all heads
(docs/rewired.md §2):

    b_tm = -softplus(tau_tm)   for m < t - 1
    b_tm = 0                   for m = t - 1 and m = t
    b_tm = -inf                for m > t (causal)

with `tau_tm = r_t . u_m` (dot) or `r_t^T Bmat u_m` (bilinear), and the runway vector
`r_t = u_{t-1}` ("last") or `mean(u_0 .. u_{t-1})` ("mean"). `r_t` only matters for
`t >= 2` (a query at 0 or 1 has no source `m < t - 1`).

The reference walks query tiles of `bq` rows; each tile takes its rows of the logits
over the keys `[0, t_last]` at once (an exact softmax, `bq x T` per head, never `n x T`)
and runs under `torch.utils.checkpoint` when gradients are on, so the backward keeps
only the inputs and recomputes one tile at a time: memory stays linear in `n`.

Packed documents (`positions` `[B, T]`, each token's position inside its document; whole
rows only): every document is read as a row of its own in one call. Query `t` reads the
keys `[t - positions_t, t]` of its document; the bias's exemptions need nothing more (`m = t`
is always the document's, `m = t - 1` is another's only at a document's first token, where
the mask removes it), and the runway is the document's: `u_{t-1}` for positions >= 1 (a
document's first token has none; a query at position 0 or 1 has no biased source) or the
mean of the document's tokens before `t`. q and k come rotated at the document positions
(the caller's RoPE; nothing here rotates), so nothing else depends on the positions. On the
CPU a tile reads only the keys from its queries' earliest document start (work linear in the
documents' lengths); elsewhere from 0 (reading that start back would make the host wait for
the device; the mask alone is exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from fsf_kernels.common.args import check_document_positions
from fsf_kernels.common.support import rewired_unsupported
from fsframework.ops.dispatch import kernel_for

RUNWAYS = ("last", "mean")
SCORES = ("dot", "bilinear")
QUERY_TILE = 128


@dataclass(frozen=True)
class RewiredSettings:
    """A layer's runway and score (docs/rewired.md §1-§2), passed whole to `rewired_attention`.

    runway: "last" (`r_t = u_{t-1}`) or "mean" (`mean(u_0..u_{t-1})`); score: "dot" or
    "bilinear" (`r_t^T Bmat u_m`), or None for "bilinear" when a `bmat` is given, else "dot".
    `Bmat` itself is not a setting: it is a learned tensor the op differentiates, passed
    beside q, k, v and u."""

    runway: str = "last"
    score: str | None = None

    def score_for(self, bmat: torch.Tensor | None) -> str:
        """The score in effect with `bmat` (None: no Bmat)."""
        return self.score if self.score is not None else ("dot" if bmat is None else "bilinear")


def check_rewired_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, *, runway: str,
                       score: str, bmat: torch.Tensor | None, q_start: int,
                       positions: torch.Tensor | None = None) -> None:
    """Raise ValueError naming the argument that does not fit (docs/rewired.md §4; `positions`:
    `check_positions`)."""
    if runway not in RUNWAYS:
        raise ValueError(f"runway must be one of {RUNWAYS}, got {runway!r}")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if not isinstance(q_start, int) or q_start < 0:
        raise ValueError(f"q_start must be a non-negative int, got {q_start!r}")
    if q.dim() != 4:
        raise ValueError(f"q must be [B, n, H, d], got shape {tuple(q.shape)}")
    bsz, n, heads, dim = q.shape
    total = q_start + n
    if tuple(k.shape) != (bsz, total, heads, dim) or k.shape != v.shape:
        raise ValueError(f"queries at [{q_start}, {total}) need k and v of shape [B, q_start + n, H, d] = "
                         f"{(bsz, total, heads, dim)}, got {tuple(k.shape)} and {tuple(v.shape)}")
    if tuple(u.shape) != (bsz, total, dim):
        raise ValueError(f"u (the runway head's values) must have shape [B, q_start + n, d] = {(bsz, total, dim)}, "
                         f"got {tuple(u.shape)}")
    if score == "bilinear":
        if bmat is None:
            raise ValueError("score='bilinear' needs bmat, a [d, d] matrix")
        if tuple(bmat.shape) != (dim, dim):
            raise ValueError(f"bmat must be [d, d] = {(dim, dim)}, got {tuple(bmat.shape)}")
    elif bmat is not None:
        raise ValueError("score='dot' takes no bmat (pass score='bilinear' with it)")
    if positions is not None:
        check_positions(positions, q, k, q_start)


def check_positions(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_start: int) -> None:
    """Packed documents' positions: whole rows (q_start 0, as many queries as keys), and an integer
    (int64) `[B, T]` on q's device, 0 at every row's first token and at each document's start, +1 per
    token within a document (`fsf_kernels.common.args.check_document_positions`, the window op's
    check: the values are read off CUDA only, where reading them would make the host wait for the
    device)."""
    if q_start != 0 or q.shape[1] != k.shape[1]:
        raise ValueError(f"positions (packed documents) take whole rows: q_start must be 0 and q as long as k, "
                         f"got q_start={q_start}, {q.shape[1]} queries, {k.shape[1]} keys")
    check_document_positions(positions, q)


def runway_vectors(u: torch.Tensor, runway: str, q_start: int, n: int,
                   positions: torch.Tensor | None = None) -> torch.Tensor:
    """The runway vectors `r_t` `[B, n, d]` of the queries at `[q_start, q_start + n)` from u `[B, T, d]`
    (docs/rewired.md §1). Rows whose query has no biased source (t < 2) are zeros or unused.

    positions: None, or each token's position inside its document `[B, T]` (q_start 0): the runway of
    the document alone. "last" is then the same gather (`u_{t-1}` at positions >= 1; a document's
    first token reads its predecessor in the row, never used: it has no biased source)."""
    if positions is not None and runway == "mean":
        return _document_prefix_mean(u, positions)
    t = torch.arange(q_start, q_start + n, device=u.device)
    if runway == "last":
        # r_t = u_{t-1}; t = 0 has no predecessor (and no biased source): take u_0, never used
        return u[:, (t - 1).clamp_min(0)]
    # r_t = (u_0 + ... + u_{t-1}) / t: an exclusive prefix sum, in fp64 so long prefixes keep their bits
    csum = torch.cumsum(u.double(), dim=1)
    prev = csum[:, (t - 1).clamp_min(0)]
    return (prev / t.clamp_min(1).double()[None, :, None]).to(torch.promote_types(u.dtype, torch.float32))


def _document_prefix_mean(u: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The "mean" runway of packed documents: `r_t = mean(u_s, s in [t - positions_t, t))`, the mean over
    the document's own tokens before t (zeros at its first token, never used), `[B, T, d]`.

    One prefix sum over the row, restarted at each document by subtracting its value at the
    document's start (in fp64, as the row's own prefix mean): no loop over documents."""
    csum = F.pad(torch.cumsum(u.double(), dim=1), (0, 0, 1, 0))  # [B, T + 1, d]: csum[:, i] = u_0 + ... + u_{i-1}
    first = torch.arange(u.shape[1], device=u.device) - positions  # [B, T]: where each document starts
    before = csum[:, :-1] - csum.gather(1, first[..., None].expand(-1, -1, u.shape[2]))
    mean = before / positions.clamp_min(1).double()[..., None]
    return mean.to(torch.promote_types(u.dtype, torch.float32))


def rewired_bias(r: torch.Tensor, u: torch.Tensor, t: torch.Tensor, key0: int = 0,
                 first: torch.Tensor | None = None) -> torch.Tensor:
    """Bias `[B, len(t), T']` for queries at absolute positions `t` with runway rows r `[B, len(t), d]`
    (already multiplied by Bmat for the bilinear score) over the keys u `[B, T', d]` at `[key0, key0 + T')`.
    first: None, or `[B, len(t)]` where each query's document starts: earlier keys are masked."""
    tau = torch.einsum("bid,bjd->bij", r, u)
    m = torch.arange(key0, key0 + u.shape[1], device=u.device)
    delta = t[:, None] - m[None, :]  # t - m
    bias = torch.where(delta >= 2, -F.softplus(tau), torch.zeros_like(tau))
    bias = bias.masked_fill(delta < 0, float("-inf"))
    if first is not None:
        # other documents' keys (t - 1 too, at a document's first token: exempt from the bias, not from this)
        bias = bias.masked_fill(m < first[..., None], float("-inf"))
    return bias


def _tile(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, u: torch.Tensor,
          t: torch.Tensor, key0: int = 0, first: torch.Tensor | None = None) -> torch.Tensor:
    """Queries q `[B, bq, H, d]` at positions t over keys `[key0, t[-1]]` (k, v, u cut to them); first:
    as `rewired_bias`'s."""
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    logits = logits + rewired_bias(r, u, t, key0, first)[:, None]
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(logits, dim=-1), v)


def rewired_rows(u: torch.Tensor, runway: str, bmat: torch.Tensor | None, q_start: int, n: int,
                 positions: torch.Tensor | None = None) -> torch.Tensor:
    """The row operand of the bias tiles: `r_t` (dot) or `r_t^T Bmat` (bilinear), `[B, n, d]`; positions:
    as `runway_vectors`'."""
    r = runway_vectors(u, runway, q_start, n, positions)
    return r if bmat is None else r @ bmat.to(r.dtype)


def rewired_attention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, u: torch.Tensor,
                           q_start: int = 0, tile: int = QUERY_TILE,
                           positions: torch.Tensor | None = None) -> torch.Tensor:
    """The reference given the bias rows r `[B, n, d]` (`rewired_rows`), `tile` queries at a time.

    positions: None, or `[B, T]` (q_start 0, valid as `check_positions` says; r built with them):
    each query reads only its document's keys (module docstring).

    This is the computation the Triton kernel replaces (`fsf_kernels.rewired_attention`
    takes the same tensors); half inputs are computed in fp32."""
    out_dtype = q.dtype
    work = torch.promote_types(q.dtype, torch.float32)
    q, k, v, r, u = (x.to(work) for x in (q, k, v, r, u))
    n = q.shape[1]
    if n == 0:
        return q.to(out_dtype)
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, r, u))
    first, key_starts = None, [0] * len(range(0, n, tile))
    if positions is not None:
        first = torch.arange(n, device=q.device) - positions  # [B, T]: where each token's document starts
        if first.device.type == "cpu":
            # documents are runs, so first rises along a row: a tile's earliest start is at its first query
            key_starts = first[:, ::tile].amin(0).tolist()
    out = []
    for lo, key0 in zip(range(0, n, tile), key_starts):
        hi = min(lo + tile, n)
        keys = q_start + hi  # keys [key0, keys) cover this tile's causal span (and its documents')
        t = torch.arange(q_start + lo, q_start + hi, device=q.device)
        args = (q[:, lo:hi], k[:, key0:keys], v[:, key0:keys], r[:, lo:hi], u[:, key0:keys], t)
        if first is not None:
            args += (key0, first[:, lo:hi])
        out.append(checkpoint(_tile, *args, use_reentrant=False) if grad else _tile(*args))
    return torch.cat(out, dim=1).to(out_dtype)


def rewired_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, *,
                      settings: RewiredSettings = RewiredSettings(), bmat: torch.Tensor | None = None,
                      impl: str = "auto", q_start: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Runway-rewired causal attention (docs/rewired.md §2) of queries at `[q_start, q_start + n)`.

    q `[B, n, H, d]` and k `[B, q_start + n, H, d]` already rotated (RoPE), v like k,
    u `[B, q_start + n, d]` the re-purposed head's value vectors of every key position
    (the mean runway needs all of them). settings: the runway and score (`RewiredSettings`;
    the default is the "last" runway, with the "bilinear" score when `bmat` `[d, d]` is
    given, else "dot"). Returns `[B, n, H, d]` in q's dtype. Gradients reach q, k, v, u and
    bmat. impl: see `fsframework.ops.dispatch`.

    positions: None (each row one sequence), or int64 `[B, T]` for packed documents (whole rows:
    q_start 0, n = T): each token's position inside its document, 0 at a document's start and +1
    per token within it. Each document is then read exactly as a row of its own (its keys, its
    bias exemptions, its runway), all of them in one call; q and k must come rotated at these
    positions. The values are checked on the CPU only (`check_positions`).
    """
    score = settings.score_for(bmat)
    check_rewired_args(q, k, v, u, runway=settings.runway, score=score, bmat=bmat, q_start=q_start,
                       positions=positions)
    kernel = kernel_for("rewired_attention", "rewired_attention_rows", impl, q,
                        rewired_unsupported(q.dtype, q.shape[-1]))
    r = rewired_rows(u, settings.runway, bmat, q_start, q.shape[1], positions)
    if kernel is not None:
        return kernel(q, k, v, r, u, q_start=q_start, positions=positions)
    return rewired_attention_rows(q, k, v, r, u, q_start=q_start, positions=positions)
