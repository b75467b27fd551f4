"""The keys of earlier ranks: the sequence-parallel `KeySource` of every attention kind.

Legend: B batch, n own queries (positions `[a, b)` of the sequence, `a = sp.start`,
`b = sp.end`), H heads, d head width, w window.

Every attention kind is written once, for queries at `[start, start + n)`
(`fsframework.models.attention`); under sequence parallelism `start = a` and the
keys of `[0, a)` live on the earlier ranks. What a kind needs is its registry
entry's key span:
- the whole prefix (TF++, ALiBi, sinusoidal, FS, FS-B): keys and values of `[0, b)`
  by ONE all-gather (as Llama 3 context parallelism). Keys travel in the form the
  kind's projection gives them: rotated at their absolute positions for TF++,
  unrotated for FreeSolo (routing and readout are NoPE; the cell summaries are
  recomputed locally from the gathered keys, so they are bit-identical to the
  single-process ones).
- FS-L's retained cells: only the window, the recent cells and the top-`P` cells by
  key norm of the earlier ranks, a byte count constant in N
  (`fsframework.parallel.retained`).
- a window of `w` keys (SWA): only the halo of the `w` keys before `a`, point to point.

Load balancing: slices are contiguous runs of whole query blocks, so later ranks
do more causal attention work than earlier ones (no zigzag); for SWA and the
FreeSolo local and readout branches the work per query is bounded and the load
is balanced; FS routing grows with the prefix like causal attention.
"""

from __future__ import annotations

import torch

from fsframework.models.context import RetainedCells, Span
from fsframework.parallel.collectives import gather_sequence, halo_exchange
from fsframework.parallel.context import SPContext
from fsframework.parallel.retained import retained_kv


def gather_kv(k: torch.Tensor, v: torch.Tensor, sp: SPContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Own `k, v` `[B, n, H, d]` -> `[B, b, H, d]` each, in ONE collective (k and v concatenated on d)."""
    kv = gather_sequence(torch.cat((k, v), dim=-1), sp)
    return kv.split(k.shape[-1], dim=-1)


def halo_kv(k: torch.Tensor, v: torch.Tensor, sp: SPContext, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Own `k, v` `[B, n, H, d]` -> `[B, h + n, H, d]` each, `h = min(width, a)` keys of the earlier
    ranks in front, in ONE exchange (k and v concatenated on d)."""
    dim = k.shape[-1]
    halo = halo_exchange(torch.cat((k, v), dim=-1), sp, width)  # B h H 2d
    return torch.cat((halo[..., :dim], k), dim=1), torch.cat((halo[..., dim:], v), dim=1)


class SequenceParallelKeys:
    """`KeySource` of one SP rank: queries of `[a, b)`, earlier keys from the earlier ranks."""

    def __init__(self, sp: SPContext):
        self.sp = sp

    @property
    def start(self) -> int:
        return self.sp.start

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        if span is None:
            return gather_kv(k, v, self.sp)
        if isinstance(span, RetainedCells):
            return retained_kv(k, v, self.sp, span)
        return halo_kv(k, v, self.sp, span)
