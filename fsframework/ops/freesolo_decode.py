"""Decode states of FreeSolo layers (docs/freesolo.md §1.9, docs/decoding.md): plain state objects that
`fsframework.ops.freesolo_driver.freesolo` carries from one piece of decoding to the next.

Legend: B batch, H heads, d head width, s cell_size, Bq block_size, w window, P retained
cells, W recent cells, C cells eligible so far.

The driver runs a piece one query block at a time (a prefill chunk that crosses blocks is cut at
the block boundaries), so the queries of a piece share one available set, which changes only when
a piece starts a new block. Then the cells completed since the last boundary become eligible
(`admit`): their summaries (mean key `kbar`, largest key norm `a`) are computed once, from their
raw keys.

- `FSDecodeState` (FS): every raw key/value, head-major (`[B, H, T, d]`, so a head's cells are one
  view), and the summaries of every eligible cell, both `GrowingBuffer`s; a query scores all
  of them (`O(C)` per token, as the routing does).
- `FSBDecodeState` (FS-B, `fsframework.ops.fsb_decode`): FS's archive and summaries, and FS-B's
  routing state (the forests of docs/freesolo.md §1.8), grown at each boundary with the new cells.
- `FSLDecodeState` (FS-L): the local window (a ring of `w` keys, rotated once when they enter),
  the unfinished block (`Bq` raw keys), and per head the candidate cells of the current
  block: the retained set (the `P` cells of largest `a` seen so far, merged with the newly
  eligible cells at each boundary) and the `W` most recent eligible cells, with their raw
  keys/values and summaries. Its size, the keys and values of `w + Bq + (P + W) s`
  positions, does not depend on the context.

A state holds tensors and counters only: the layer's settings (`FreeSoloConfig`) and prior
(`RoutingPrior`) are handed to each method, as to every FreeSolo op. The states call the ops of the
whole-sequence path: `block_candidates` prepares what a block's queries are scored against (once
per block, at its first token) and its `route` scores them, `admit_fsl` / `admit_fsb` advance FS-L's
candidate set and FS-B's forests at a boundary. So the driver's readout over them gives the logits
of a full forward pass (tests/ops/test_freesolo_cache.py).
"""

from __future__ import annotations

import torch

from fsframework.ops.buffers import GrowingBuffer, WindowKV, tensor_bytes
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_routing import BlockCandidates, FSLState, admit_fsl, block_candidates, cell_summaries
from fsframework.ops.offset_attention import window_attention_at
from fsframework.ops.rope import rotate

# (choice [B, n, H, K], kept keys and values [B, H, M, s, d], ids [B, H, M] mapping the choice to cell
# ids or None when the choice is cell ids already)
Routed = tuple[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"]


class FreeSoloDecodeState:
    """What every FreeSolo decode state keeps: the positions seen, the eligible cells, the current
    block's prepared candidates and the last piece's choice."""

    def __init__(self):
        self.length = 0  # positions seen
        self.num_cells = 0  # cells eligible for the current block: c < num_cells
        # the current block's prepared candidates (FS, FS-L): built by its first token, dropped at a boundary
        self.candidates: BlockCandidates | None = None
        # the last piece's choice and what maps it to cell ids (`selected`)
        self.selection: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def at(self, start: int) -> "FreeSoloDecodeState":
        """This state, checked to continue at position `start` (a piece must follow the last one)."""
        if start != self.length:
            raise ValueError(f"the cache holds {self.length} positions, got a piece starting at {start}")
        return self

    def enter_block(self, block: int, cfg: FreeSoloConfig, prior: RoutingPrior) -> None:
        """A piece of the query block starting at position `block` begins: the cells before it become
        eligible (once per block)."""
        if block // cfg.cell_size > self.num_cells:
            self.admit(block // cfg.cell_size, cfg, prior)
            self.candidates = None

    @property
    def selected(self) -> torch.Tensor | None:
        """The last piece's selected cells `[B, n, H, K]` (-1 = none), for diagnostics and the tests: a
        choice indexes the candidates, `ids` `[B, H, M]` (None: the choice is already cell ids) maps it,
        when asked rather than on every token."""
        if self.selection is None:
            return None
        choice, ids = self.selection
        if ids is None:
            return choice
        chosen = ids[:, None].expand(-1, choice.shape[1], -1, -1).gather(-1, choice.clamp_min(0))
        return torch.where(choice >= 0, chosen, -1)

    def local(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
              cfg: FreeSoloConfig) -> torch.Tensor:
        """Keep the piece's keys; its local branch (docs/freesolo.md §1.2) over the kept window. The driver
        counts the piece into `length` after it."""
        k_local, v_local = self.append(k, v, cfg)
        return window_attention_at(q, k_local, v_local, start, window=cfg.window, rope_theta=cfg.rope_theta,
                                   impl=cfg.impl)

    def centers(self, cells: torch.Tensor, like: torch.Tensor, cfg: FreeSoloConfig) -> torch.Tensor:
        return (cells.to(like.dtype) + 0.5) * cfg.cell_size

    def append(self, k, v, cfg):  # pragma: no cover - abstract
        raise NotImplementedError

    def admit(self, num_cells, cfg, prior):  # pragma: no cover - abstract
        raise NotImplementedError

    def route(self, q, start, cfg, prior) -> Routed:  # pragma: no cover - abstract
        raise NotImplementedError


class FSDecodeState(FreeSoloDecodeState):
    """FS: the raw key/value archive (head-major) plus the summaries of every eligible cell."""

    def __init__(self, cfg: FreeSoloConfig):
        super().__init__()
        # B H T d keys and values: a whole number of cells, so `cells` views the archive as B H C s d
        self.archive = GrowingBuffer(dim=2, multiple=cfg.cell_size)
        self.summaries = GrowingBuffer(dim=1)  # kbar B C H d, a B C H

    def append(self, k, v, cfg):
        keys, values = self.archive.append(k.transpose(1, 2), v.transpose(1, 2))
        low = max(0, self.length - cfg.window)
        return keys[:, :, low:].transpose(1, 2), values[:, :, low:].transpose(1, 2)

    def admit(self, num_cells: int, cfg: FreeSoloConfig, prior: RoutingPrior) -> None:
        """The cells `[num_cells_before, num_cells)` (the block just finished) get their summaries."""
        s = cfg.cell_size
        keys = self.archive.view(self.num_cells * s, num_cells * s)[0].transpose(1, 2).contiguous()  # B n H d
        self.summaries.append(*cell_summaries(keys, s))
        self.num_cells = num_cells

    def cells(self, x: torch.Tensor, cfg: FreeSoloConfig) -> torch.Tensor:
        """An archive buffer `[B, H, capacity, d]` viewed cell-major, `[B, H, capacity / s, s, d]`."""
        bsz, heads, capacity, dim = x.shape
        return x.view(bsz, heads, capacity // cfg.cell_size, cfg.cell_size, dim)

    def route(self, q: torch.Tensor, start: int, cfg: FreeSoloConfig, prior: RoutingPrior) -> Routed:
        """Eq. 7 over every eligible cell: the choice (cell ids) and the archive cell-major."""
        if self.candidates is None:
            kbar, a = self.summaries.view()
            a = a.transpose(1, 2)  # B H C
            centers = self.centers(torch.arange(self.num_cells, device=a.device), a, cfg)
            tokens = self.cells(self.archive.tensors[0], cfg)[:, :, :self.num_cells] \
                if cfg.route_score == "tokens" else None
            self.candidates = block_candidates(kbar.transpose(1, 2), a, centers, None, prior, tokens)
        keys, values = self.archive.tensors
        return self.candidates.route(q, start, cfg.top_k), self.cells(keys, cfg), self.cells(values, cfg), None

    @property
    def nbytes(self) -> int:
        return self.archive.nbytes + self.summaries.nbytes


class FSLDecodeState(FreeSoloDecodeState):
    """FS-L: local window, unfinished block, and per head the block's candidate cells (retained + recent)."""

    def __init__(self, cfg: FreeSoloConfig):
        super().__init__()
        self.ring = WindowKV(cfg.window)
        # B Bq H d keys, values of positions [num_cells * s, length): one block at most, cleared when it ends
        self.pending = GrowingBuffer(min_capacity=cfg.block_size)
        # FS-L's routing state (`admit_fsl`): per head the candidates of the current block, the
        # retained cells first, with their summaries and raw keys/values
        self.state: FSLState | None = None

    def local(self, q, k, v, start, cfg):
        # the ring serves only the local branch: it keeps its keys rotated, once, when they enter, so a
        # token does not re-rotate the whole window (the same rotation as the op's: the same numbers);
        # the cells keep the raw keys (`pending`), which routing and readout read unrotated
        if cfg.rope_theta is None:
            return super().local(q, k, v, start, cfg)
        q, k_rot = rotate(q, cfg.rope_theta, start), rotate(k, cfg.rope_theta, start)
        k_local, v_local = self.append(k, v, cfg, k_ring=k_rot)
        return window_attention_at(q, k_local, v_local, start, window=cfg.window, rope_theta=None, impl=cfg.impl)

    def append(self, k, v, cfg, k_ring=None):
        """Raw `k` to the unfinished block; `k_ring` (default `k`) to the local ring."""
        self.pending.append(k, v)
        return self.ring.extend(k if k_ring is None else k_ring, v)

    def admit(self, num_cells: int, cfg: FreeSoloConfig, prior: RoutingPrior) -> None:
        """The cells `[num_cells_before, num_cells)` (the block just finished) become candidates."""
        s, fresh = cfg.cell_size, num_cells - self.num_cells
        new_k, new_v = self.pending.view(0, fresh * s)
        bsz, _, heads, dim = new_k.shape
        kbar, a = cell_summaries(new_k, s)  # B F H d, B F H

        def head_major(x):  # B F s H d -> B H F s d
            return x.reshape(bsz, fresh, s, heads, dim).permute(0, 3, 1, 2, 4)

        new = FSLState(cells=torch.arange(self.num_cells, num_cells, device=a.device).expand(bsz, heads, -1),
                       a=a.transpose(1, 2), kbar=kbar.transpose(1, 2), keys=head_major(new_k), values=head_major(new_v))
        self.state = admit_fsl(self.state, new, retained=cfg.retained_cells, recent=cfg.recent_cells)
        self.pending.clear()  # the block's positions now live in the candidates (or are dropped)
        self.num_cells = num_cells

    def route(self, q: torch.Tensor, start: int, cfg: FreeSoloConfig, prior: RoutingPrior) -> Routed:
        """Eq. 7 over the candidates: the choice (positions into them), their raw keys and values, and
        their cell ids."""
        st = self.state
        if self.candidates is None:
            self.candidates = block_candidates(st.kbar, st.a, self.centers(st.cells, st.a, cfg),
                                               st.valid(self.num_cells, cfg.recent_cells), prior,
                                               st.keys if cfg.route_score == "tokens" else None)
        return self.candidates.route(q, start, cfg.top_k), st.keys, st.values, st.cells

    @property
    def nbytes(self) -> int:
        state = 0 if self.state is None else tensor_bytes(*self.state.tensors().values())
        return self.ring.nbytes + self.pending.nbytes + state
