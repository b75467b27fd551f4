"""Where an attention layer's earlier keys come from.

Every attention kind is written once, for queries at positions `[start, start + n)`
(docs/architecture.md). A `KeySource` is what a forward pass hands each layer:
`start`, and `keys(layer, k, v, span)`, which takes the layer's own keys/values of
`[start, start + n)` and returns keys/values that end with them and reach back far
enough for the kind:

- `span=None`: the whole prefix, `[0, start + n)` (full causal kinds, FreeSolo);
- `span=w`: at least the `w` keys before `start`, `[start - min(w, start), start + n)`;
- `span=RetainedCells(...)` (FS-L): `[0, start + n)` where only FS-L's cells matter: the
  window and recent cells before `start` and the top-`P` cells by key norm; a source may
  leave the other positions zero (`fsframework.parallel.retained`).

`WholeSequence` (here) is training and plain inference: `start = 0` and the keys are
the layer's own. `fsframework.parallel` gathers the earlier keys from other ranks;
`fsframework.models.decode_cache` keeps them from earlier decoding steps. The span
each kind needs is part of its registry entry (`fsframework.models.registry`).

A source that keeps per-layer state between forward passes (a decode cache) says so by
being a `LayerStateSource`: a layer whose cached form is more than its earlier keys
(FreeSolo: cell summaries, FS-L's candidates, FS-B's forests) asks it for `layer_state`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol, Union

import torch


@dataclass(frozen=True)
class RetainedCells:
    """FS-L's key span (docs/freesolo.md §1.5): the prefix, of which a query block reads only
    the `window` keys and `recent_cells` cells before it and the top-`retained_cells` cells
    by key-norm priority."""

    cell_size: int
    recent_cells: int
    retained_cells: int
    window: int


Span = Union[None, int, RetainedCells]


class KeySource(Protocol):
    start: int

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        ...


def source_positions(source: KeySource, n: int, device=None) -> torch.Tensor:
    """Absolute positions of the `n` queries `source` serves: `[start, start + n)`, unless the source
    says otherwise (a sequence-parallel rank of the zigzag layout holds two runs)."""
    if hasattr(source, "positions"):
        return source.positions(n, device)
    return torch.arange(source.start, source.start + n, device=device)


class WholeSequence:
    """The forward pass sees the whole sequence: queries and keys both cover `[0, n)`."""

    start = 0

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v


WHOLE_SEQUENCE = WholeSequence()


class LayerStateSource(ABC):
    """A `KeySource` that keeps each layer's state between forward passes (`fsframework.models.decode_cache`)."""

    start: int

    @abstractmethod
    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        ...

    @abstractmethod
    def layer_state(self, layer: int):
        """Layer `layer`'s state (its decode cache), built on first use."""
