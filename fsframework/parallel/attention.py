"""The keys of earlier ranks: the sequence-parallel `KeySource` of every attention kind.

Legend: B batch, n own queries (positions `[a, b)` of the sequence, `a = sp.start`,
`b = sp.end`), H heads, d head width, w window.

Every attention kind is written once, for queries at `[start, start + n)`
(`fsframework.models.attention`); under sequence parallelism `start = a` and the
keys of `[0, a)` live on the earlier ranks. What a kind needs is its registry
entry's key span:
- the whole prefix (TF++, ALiBi, sinusoidal, FS-B): keys and values of `[0, b)`
  by ONE all-gather (as Llama 3 context parallelism). Keys travel in the form the
  kind's projection gives them: rotated at their absolute positions for TF++,
  unrotated for FS-B (its forest search rescores cells from their token keys).
- FS (`freesolo_state`): the cell summaries of every rank by an all-gather, routing on the
  rank, then only the cells its queries selected and the window's halo, point to point
  (`fsframework.parallel.selected`).
- FS-L's retained cells: only the window, the recent cells and the top-`P` cells by
  key norm of the earlier ranks, a byte count constant in N
  (`fsframework.parallel.retained`).
- a window of `w` keys (SWA): only the halo of the `w` keys before `a`, point to point.

Load balancing (`parallel.sp_layout`, `fsframework.parallel.sharding`): under the
contiguous layout later ranks do more causal work than earlier ones. The zigzag layout
gives every rank an early and a late run, for the kinds whose work grows with position
(the "prefix" kinds: TF++, ALiBi, sinusoidal, rewired, FS routing). Each attention module
then runs once per run (`ZigzagRunsSource.runs`), in the offset form, with `RunKeys`: run 0's
keys are all-gathered first (every rank's run 0 covers `[0, M)`), then run 1's (`[M, N)`),
the same bytes as one all-gather of the whole slices. SWA and FS-L do bounded work per
query and keep the contiguous layout.
"""

from __future__ import annotations

import torch

from fsframework.models.context import CellRouter, KeySource, RetainedCells, Span
from fsframework.ops.freesolo_driver import PrefixKeys
from fsframework.parallel.collectives import gather_runs, gather_sequence, halo_exchange
from fsframework.parallel.context import SPContext
from fsframework.parallel.retained import retained_kv, retained_routed_kv
from fsframework.parallel.selected import SelectedCells


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


class SequenceParallelKeys(KeySource):
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

    def freesolo_state(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: Span,
                       routed: CellRouter) -> tuple[torch.Tensor, torch.Tensor, PrefixKeys]:
        if span is None and routed.routes_from_summaries:  # FS: only the selected cells
            k, v, cells = SelectedCells(self.sp).keys(0, layer, q, k, v, routed)
            return k, v, PrefixKeys(self.start, cells)
        if isinstance(span, RetainedCells) and routed.routes_from_summaries:
            # FS-L: its retained cells, routed here from their summaries to hand over compact keys
            k, v, cells = retained_routed_kv(q, k, v, self.sp, span, routed)
            return k, v, PrefixKeys(self.start, cells)
        # FS-L scoring token keys (route_score=tokens) reads more than summaries: the op routes over the
        # retained cells' zero prefix (`retained_kv`), where they are whole
        return super().freesolo_state(layer, q, k, v, span, routed)


class ZigzagKeys:
    """The earlier keys of one layer call under the zigzag layout: one `RunKeys` view per own run.

    The runs' gathered keys share one buffer of the layer call (run 1's reach back over run 0's:
    no second copy), kept from run 0 to run 1 (so one layer's call, also when activation
    checkpointing recomputes it, holds both)."""

    def __init__(self, sp: SPContext):
        self.sp = sp
        # layer -> (the buffer every run's gathered keys and values go to, run 0's output [0, M))
        self.first: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.selected = SelectedCells(sp)  # FS: summaries and own run-0 keys, kept for run 1

    def views(self) -> list["RunKeys"]:
        return [RunKeys(self, run) for run in range(len(self.sp.runs))]

    def keys(self, run: int, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        if span is not None:
            raise ValueError(f"the zigzag layout serves prefix kinds only, got a key span {span!r}")
        kv = torch.cat((k, v), dim=-1)
        if run == 0:
            length = max(e for runs in self.sp.all_runs for _, e in runs)
            buffer, before = kv.new_empty((kv.shape[0], length, *kv.shape[2:])), None
        else:
            buffer, before = self.first.pop(layer)
        gathered = gather_runs(kv, self.sp, run, buffer, before)
        if run + 1 < len(self.sp.runs):
            self.first[layer] = (buffer, gathered)
        end = self.sp.runs[run][1]
        return gathered[:, :end].split(k.shape[-1], dim=-1)


class RunKeys(KeySource):
    """`KeySource` of one own run of the zigzag layout: queries of `[start, end)` of that run."""

    def __init__(self, parent: ZigzagKeys, run: int):
        self.parent, self.run = parent, run
        self.start = parent.sp.runs[run][0]

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor, span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        return self.parent.keys(self.run, layer, k, v, span)

    def freesolo_state(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: Span,
                       routed: CellRouter) -> tuple[torch.Tensor, torch.Tensor, PrefixKeys]:
        if span is None and routed.routes_from_summaries:  # FS: only the selected cells
            k, v, cells = self.parent.selected.keys(self.run, layer, q, k, v, routed)
            return k, v, PrefixKeys(self.start, cells)
        return super().freesolo_state(layer, q, k, v, span, routed)


class ZigzagRunsSource(KeySource):
    """What the model hands every layer under the zigzag layout: the rank's runs; each attention
    module splits its call by run (`runs`, `QKVAttention.forward`), inside its one module call.
    `positions` are the runs' absolute positions (for the sinusoidal table)."""

    def __init__(self, sp: SPContext):
        self.sp = sp
        self.start = sp.runs[0][0]

    def positions(self, n: int, device=None) -> torch.Tensor:
        return torch.cat([torch.arange(s, e, device=device) for s, e in self.sp.runs])

    def runs(self, x: torch.Tensor) -> list[tuple[torch.Tensor, KeySource]]:
        """This layer call's rows of `x` `[B, n_0 + n_1, D]` per own run, each with its `RunKeys`
        (one `ZigzagKeys` per layer call: run 1 reads the buffer run 0's gather filled)."""
        lengths = [e - s for s, e in self.sp.runs]
        return list(zip(x.split(lengths, dim=1), ZigzagKeys(self.sp).views()))

    def keys(self, layer, k, v, span):  # pragma: no cover - a layer asks each run's source, never this one
        raise RuntimeError("under the zigzag layout keys are fetched per run (ZigzagRunsSource.runs)")
