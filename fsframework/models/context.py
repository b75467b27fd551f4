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

Every source subclasses `KeySource`, which also declares what a layer may ask of any source:
`keeps_keys` (the keys it is handed are kept for later steps), `positions(n, device)`
(the queries' absolute positions, `[start, start + n)` unless the source says otherwise) and
`freesolo_state` (keys and the state a FreeSolo layer's op reads: where the source routes, the cells
its queries select; a decode cache's carried state).

`WholeSequence` (here) is training and plain inference: `start = 0` and the keys are
the layer's own. `fsframework.parallel` gathers the earlier keys from other ranks;
`fsframework.models.decode_cache` keeps them from earlier decoding steps. The span
each kind needs is part of its registry entry (`fsframework.models.registry`).

A source that keeps per-layer state between forward passes (a decode cache) says so by
being a `LayerStateSource`: for a layer whose cached form is more than its earlier keys
(FreeSolo: cell summaries, FS-L's candidates, FS-B's forests) it keeps a `layer_state`, which it
hands the FreeSolo op through `freesolo_state`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional, Protocol, Union

import torch

from fsframework.models.documents import Documents
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_driver import PrefixKeys, Router
from fsframework.ops.freesolo_driver import State as FreeSoloState


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


class CellRouter(Protocol):
    """What a source needs of a routed layer to route for it from cell summaries
    (`fsframework.models.freesolo_attention.FreeSoloAttention`): data, which the source hands to the
    FreeSolo ops (`fsframework.ops.freesolo.summarize_cells`, `select_cells_from_summaries`)."""

    settings: "FreeSoloConfig"  # the layer's FreeSolo settings (cell_size, block_size, window, ...)

    @property
    def prior(self) -> "RoutingPrior":
        """The layer's routing prior (sigma, lam per head)."""

    @property
    def routes_from_summaries(self) -> bool:
        """Its routing reads only the cells' summaries (FS, FS-L), so a source may route from gathered ones."""

    # what replaces the op's routing in whole-sequence forwards (diagnostics, ablations); None: the op's
    router: Optional["Router"]


class KeySource(ABC):
    """Where a layer's earlier keys come from (module docstring); every source subclasses it."""

    start: int  # absolute position of the first query

    # the keys handed to `keys` are kept for later steps (a decode cache), so a layer may hand them
    # in a form worth keeping (SWA: rotated once, rather than the whole window re-rotated each step)
    keeps_keys: bool = False

    # the documents of packed rows, each read as a row of its own (`fsframework.models.documents`);
    # None: every row is one sequence
    documents: Optional[Documents] = None

    @abstractmethod
    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s own keys/values `[B, n, H, d]` of the queries -> the keys/values its
        offset form reads for `span`, ending with them."""

    def positions(self, n: int, device=None) -> torch.Tensor:
        """Absolute positions of the `n` queries this source serves: `[start, start + n)` (a
        sequence-parallel rank of the zigzag layout holds two runs)."""
        return torch.arange(self.start, self.start + n, device=device)

    def runs(self, x: torch.Tensor) -> list[tuple[torch.Tensor, "KeySource"]]:
        """A layer's input `x` `[B, n, D]` as the contiguous runs its offset form runs on, each with
        its own source: `x` and this source, except on a sequence-parallel rank of the zigzag
        layout, which holds two runs (`fsframework.parallel.attention.ZigzagRunsSource`)."""
        return [(x, self)]

    def freesolo_state(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: Span,
                       routed: "CellRouter") -> tuple[torch.Tensor, torch.Tensor, "FreeSoloState"]:
        """What a FreeSolo layer hands its op (`fsframework.ops.freesolo_driver.freesolo`): the keys,
        values and state of its queries. Here `keys` and a `PrefixKeys` state without cells: the op routes
        the queries over the keys (with the layer's `router` hook, if set). A sequence-parallel source
        builds the state from the other ranks: the cells its queries select, routed from the gathered
        cell summaries, and compact keys (the selected cells, then the `span` window's positions before
        `start` and the own keys; `fsframework.parallel.selected`, `retained`); a decode cache hands its
        layer's decode state (`fsframework.models.decode_cache`)."""
        k, v = self.keys(layer, k, v, span)
        return k, v, PrefixKeys(self.start, None, routed.router)


class WholeSequence(KeySource):
    """The forward pass sees the whole sequence: queries and keys both cover `[0, n)`."""

    start = 0

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v


WHOLE_SEQUENCE = WholeSequence()


class DocumentRows(WholeSequence):
    """Training on packed rows with document masking: a sequence-mixing layer reads each document as a
    row of its own (`Documents.map`, with `WHOLE_SEQUENCE` inside), and absolute positions restart at
    each document's start.

    A part of the rows (a sequence-parallel rank's, `fsframework.parallel.documents`) may begin inside
    a document (`Documents.continuations`): that piece reads the document's earlier part, which
    `earlier_tokens` supplies; on one process every row begins its first document."""

    def __init__(self, documents: Documents):
        self.documents = documents

    def positions(self, n: int, device=None) -> torch.Tensor:
        """`[B, n]`: each token's position inside its document."""
        return self.documents.positions.to(device)

    def earlier_tokens(self, x: torch.Tensor, span: Span) -> torch.Tensor:
        """A sequence-mixing layer's input `x` `[B, n, ...]` of this part of the rows -> that layer's input
        at the positions each continuation piece reads before its start, the pieces' laid end to end
        `[P, ...]` (`earlier_pieces` cuts them apart): the `reach_back(span, start)` positions before the
        piece, its document's whole earlier part or a window `span`'s last keys. A layer calls it once
        per call, also when no piece of its own continues a document: under sequence parallelism it is
        an exchange that every rank takes part in. Here (whole rows) there is nothing before."""
        return x.reshape(-1, *x.shape[2:])[:0]

    def continued_keys(self, x: torch.Tensor, span: Span, project,
                       layer: Optional["CellRouter"] = None) -> tuple[list[torch.Tensor], list[tuple]]:
        """A layer's input `x` `[B, n, D]` -> (the exchanges' outputs, which the layer's output is tied to
        with `after_earlier`; for each continuation piece the keys and values `[1, p, H, d]` of the `p`
        positions before it that its offset form reads). Here its document's earlier part (a window span:
        its window) from `earlier_tokens`, projected by `project(x, start) -> q, k, v` at the document's
        positions; a sequence-parallel source may hand a zero prefix with only what FreeSolo's cells read
        (FS-L: `fsframework.parallel.document_retained`; FS routed here for `layer`, its cells a third entry:
        `document_selected`). Called once per layer call on every rank."""
        earlier = self.earlier_tokens(x, span)
        keys = []
        for before, (_, _, start) in zip(earlier_pieces(self.documents, earlier, span), self.documents.continuations):
            _, k, v = project(before, start - before.shape[1])
            keys.append((k, v))
        return [earlier], keys

    def earlier_roots(self, h: torch.Tensor, combine) -> tuple[torch.Tensor, list[dict]]:
        """AR-GRC's scan leaves `h` `[B, n, D]` of this part of the rows -> (what the exchange received, for
        each continuation piece the roots `{(first, size): [1, D]}` of aligned blocks tiling its document's
        earlier part, or their halves; `fsframework.parallel.document_roots`). Called once per forward, also
        with no piece of its own (an exchange under sequence parallelism); here nothing is before."""
        return h.reshape(-1, h.shape[-1])[:0], []


class ContinuedDocument(KeySource):
    """A continuation piece's source: queries at `[start, start + n)` of their document, whose keys and
    values of `[start - p, start)` (`p = start`, or at least the window of a window span) the layer
    computed from `DocumentRows.earlier_tokens`; `keys` puts them before the piece's own."""

    def __init__(self, start: int, k: torch.Tensor, v: torch.Tensor, cells: Optional[torch.Tensor] = None):
        self.start, self.k, self.v = start, k, v
        # a FreeSolo piece routed by the source (`fsframework.parallel.document_selected`): its cells, and
        # earlier keys that hold only what they read
        self.cells = cells

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Span) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat((self.k, k), dim=1), torch.cat((self.v, v), dim=1)

    def freesolo_state(self, layer, q, k, v, span, routed):
        if self.cells is None:
            return super().freesolo_state(layer, q, k, v, span, routed)
        k, v = self.keys(layer, k, v, span)
        return k, v, PrefixKeys(self.start, self.cells, None)


class _AfterEarlier(torch.autograd.Function):
    """`y` itself; backward hands `earlier` a zero gradient besides `y`'s own."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
        ctx.shape, ctx.dtype = earlier.shape, earlier.dtype
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad.new_zeros(ctx.shape, dtype=ctx.dtype)


def after_earlier(y: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
    """A layer's output `y` tied to the `earlier_tokens` it was handed, so that every rank's backward
    runs the exchange's backward, also where no piece read `earlier`: under sequence parallelism the
    ranks whose pieces did read it wait in that backward for their peers' part."""
    return _AfterEarlier.apply(y, earlier) if earlier.requires_grad else y


def earlier_pieces(documents: Documents, earlier: torch.Tensor, span: Span) -> list[torch.Tensor]:
    """`DocumentRows.earlier_tokens`' `[P, ...]` for a layer of key span `span` -> for each of
    `documents.continuations`, the layer's input before it `[1, reach_back(span, start), ...]`."""
    reaches = [reach_back(span, start) for _, _, start in documents.continuations]
    if sum(reaches) != earlier.shape[0]:
        raise ValueError(f"the continuation pieces read {sum(reaches)} earlier positions, got {earlier.shape[0]}")
    return [piece[None] for piece in earlier.split(reaches)]


def reach_back(span: Span, start: int) -> int:
    """How many keys before `start` a layer of key span `span` reads: the window of a window span, else
    the whole prefix (FS-L's retained cells index the prefix by position)."""
    return min(span, start) if isinstance(span, int) else start


class LayerStateSource(KeySource):
    """A `KeySource` that keeps each layer's state between forward passes (`fsframework.models.decode_cache`)."""

    @abstractmethod
    def layer_state(self, layer: int):
        """Layer `layer`'s state (its decode cache), built on first use."""
