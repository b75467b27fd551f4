"""Decode caches of FreeSolo layers (docs/freesolo.md §1.9, docs/decoding.md).

Legend: B batch, H heads, d head width, s cell_size, Bq block_size, w window, P retained
cells, W recent cells, C cells eligible so far.

The caches compute a layer's two branches one query block at a time (a prefill chunk that
crosses blocks is run block by block), so the queries of a piece share one available set,
which changes only when a piece starts a new block. Then the cells
completed since the last boundary become eligible: their summaries (mean key `kbar`,
largest key norm `a`) are computed once, from their raw keys.

- `FSCache` (FS): every raw key/value, head-major (`[B, H, T, d]`, so a head's cells are one
  view), and the summaries of every eligible cell, both `GrowingBuffer`s; a query scores all
  of them (`O(C)` per token, as the routing does).
- `FSBCache` (FS-B, `fsframework.models.fsb_cache`): FS's archive and summaries, and FS-B's
  routing state (the forests of docs/freesolo.md §1.8), grown at each boundary with the new cells.
- `FSLCache` (FS-L): the local window (a ring of `w` keys, rotated once when they enter),
  the unfinished block (`Bq` raw keys), and per head the candidate cells of the current
  block: the retained set (the `P` cells of largest `a` seen so far, merged with the newly
  eligible cells at each boundary) and the `W` most recent eligible cells, with their raw
  keys/values and summaries. Its size, the keys and values of `w + Bq + (P + W) s`
  positions, does not depend on the context.

A cache is built from its layer's data (`settings`, a `FreeSoloConfig`; `prior`, a `RoutingPrior`;
`fsframework.ops.freesolo_config`) and is handed the readout gain with each piece: it calls
nothing of the layer. The caches hold tensors and call the ops of the whole-sequence path: `block_candidates`
prepares what a block's queries are scored against (once per block, at its first token) and its
`route` scores them, `admit_fsl` / `admit_fsb` advance FS-L's candidate set and FS-B's
forests at a boundary, `cell_readout_kept` is `cell_readout` over the kept cells. So all give
the logits of a full forward pass (tests/models/test_decode_cache.py).
"""

from __future__ import annotations

import torch
from torch import nn

from fsframework.models.kv_cache import GrowingBuffer, WindowKV, tensor_bytes
from fsframework.ops.freesolo import cell_readout_kept
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_routing import (BlockCandidates, FSLState, admit_fsl, block_candidates, cell_summaries,
                                               query_blocks)
from fsframework.ops.offset_attention import window_attention_at
from fsframework.ops.rope import rotate


class _FreeSoloLayerCache:
    """What the FreeSolo caches share: the piece checks, the local branch and the long-range read."""

    def __init__(self, module: nn.Module):
        # the layer's settings and routing prior, as data (the prior's tensors are the layer's buffers)
        self.settings: FreeSoloConfig = module.settings
        self.prior: RoutingPrior = module.prior
        a = self.settings
        self.window, self.cell_size, self.block_size = a.window, a.cell_size, a.block_size
        self.num_cells = 0  # cells eligible for the current block: c < num_cells
        self.length = 0
        self.top_k = a.top_k
        # the current block's prepared candidates (FS, FS-L): built by its first token, dropped at a boundary
        self.candidates: BlockCandidates | None = None
        # the last piece's choice and what maps it to cell ids (`selected`)
        self._selection: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def branches(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                 gain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unrotated q, k, v `[B, n, H, d]` of positions `[start, start + n)` -> (local, LR) `[B, n, H, d]`;
        gain: the layer's readout RMSNorm gain `[H, d]` (docs/freesolo.md §1.6).

        A piece that crosses query blocks (a prefill chunk) is run block by block."""
        if start != self.length:
            raise ValueError(f"the cache holds {self.length} positions, got a piece starting at {start}")
        pieces = list(query_blocks(self.block_size, start, start + q.shape[1]))
        if len(pieces) <= 1:  # a decoded token, or a chunk inside one block: no copy
            return self._block_branches(q, k, v, start, gain)
        outs = []
        for lo, hi in pieces:
            piece = slice(lo - start, hi - start)
            outs.append(self._block_branches(q[:, piece], k[:, piece], v[:, piece], lo, gain))
        return torch.cat([o[0] for o in outs], dim=1), torch.cat([o[1] for o in outs], dim=1)

    def _block_branches(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                        gain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`branches` for a piece inside one query block: its queries share one available set."""
        n = q.shape[1]
        block = start - start % self.block_size
        if block // self.cell_size > self.num_cells:
            self._admit(block // self.cell_size)  # a new block: its eligible prefix moves
            self.candidates = None
        local = self._local(q, k, v, start, self.settings)
        self.length += n
        if self.num_cells == 0:  # the first block reads nothing long range: exactly 0, as in the full form
            self._selection = (torch.full((*q.shape[:3], self.top_k), -1, dtype=torch.long, device=q.device), None)
            return local, torch.zeros_like(q)
        choice, cells_k, cells_v, ids = self._route(q, start)
        self._selection = (choice, ids)
        return local, cell_readout_kept(q, cells_k, cells_v, choice, rms_weight=gain)

    @property
    def selected(self) -> torch.Tensor | None:
        """The last piece's selected cells `[B, n, H, K]` (-1 = none), for diagnostics and the tests: a
        choice indexes the candidates, `ids` `[B, H, M]` (None: the choice is already cell ids) maps it,
        when asked rather than on every token."""
        if self._selection is None:
            return None
        choice, ids = self._selection
        if ids is None:
            return choice
        chosen = ids[:, None].expand(-1, choice.shape[1], -1, -1).gather(-1, choice.clamp_min(0))
        return torch.where(choice >= 0, chosen, -1)

    def _local(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, a) -> torch.Tensor:
        """Cache the piece's keys; its local branch (docs/freesolo.md §1.2) over the cached window."""
        k_local, v_local = self._append(k, v)
        return window_attention_at(q, k_local, v_local, start, window=a.window, rope_theta=a.rope_theta,
                                   impl=a.impl)

    def _centers(self, cells: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return (cells.to(like.dtype) + 0.5) * self.cell_size


class FSCache(_FreeSoloLayerCache):
    """FS: the raw key/value archive (head-major) plus the summaries of every eligible cell."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        # B H T d keys and values: a whole number of cells, so `cells` views the archive as B H C s d
        self.archive = GrowingBuffer(dim=2, multiple=self.cell_size)
        self.summaries = GrowingBuffer(dim=1)  # kbar B C H d, a B C H

    def _append(self, k, v):
        keys, values = self.archive.append(k.transpose(1, 2), v.transpose(1, 2))
        low = max(0, self.length - self.window)
        return keys[:, :, low:].transpose(1, 2), values[:, :, low:].transpose(1, 2)

    def _admit(self, num_cells: int) -> None:
        """The cells `[num_cells_before, num_cells)` (the block just finished) get their summaries."""
        s = self.cell_size
        keys = self.archive.view(self.num_cells * s, num_cells * s)[0].transpose(1, 2).contiguous()  # B n H d
        self.summaries.append(*cell_summaries(keys, s))
        self.num_cells = num_cells

    def cells(self, x: torch.Tensor) -> torch.Tensor:
        """An archive buffer `[B, H, capacity, d]` viewed cell-major, `[B, H, capacity / s, s, d]`."""
        bsz, heads, capacity, dim = x.shape
        return x.view(bsz, heads, capacity // self.cell_size, self.cell_size, dim)

    def _route(self, q: torch.Tensor, start: int):
        """Eq. 7 over every eligible cell: the choice `[B, n, H, K]` (cell ids), the archive cell-major,
        None (the choice is the cell ids)."""
        if self.candidates is None:
            kbar, a = self.summaries.view()
            a = a.transpose(1, 2)  # B H C
            centers = self._centers(torch.arange(self.num_cells, device=a.device), a)
            self.candidates = block_candidates(kbar.transpose(1, 2), a, centers, None, self.prior)
        keys, values = self.archive.tensors
        return self.candidates.route(q, start, self.top_k), self.cells(keys), self.cells(values), None

    @property
    def nbytes(self) -> int:
        return self.archive.nbytes + self.summaries.nbytes


class FSLCache(_FreeSoloLayerCache):
    """FS-L: local window, unfinished block, and per head the block's candidate cells (retained + recent)."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        self.retained, self.recent = self.settings.retained_cells, self.settings.recent_cells
        self.local = WindowKV(self.window)
        # B Bq H d keys, values of positions [num_cells * s, length): one block at most, cleared when it ends
        self.pending = GrowingBuffer(min_capacity=self.block_size)
        # FS-L's routing state (`admit_fsl`): per head the candidates of the current block, the
        # retained cells first (`num_kept` of them), with their summaries and raw keys/values
        self.state: FSLState | None = None

    def _local(self, q, k, v, start, a):
        # the ring serves only the local branch: it keeps its keys rotated, once, when they enter, so a
        # token does not re-rotate the whole window (the same rotation as the op's: the same numbers);
        # the cells keep the raw keys (`pending`), which routing and readout read unrotated
        if a.rope_theta is None:
            return super()._local(q, k, v, start, a)
        q, k_rot = rotate(q, a.rope_theta, start), rotate(k, a.rope_theta, start)
        k_local, v_local = self._append(k, v, k_rot)
        return window_attention_at(q, k_local, v_local, start, window=a.window, rope_theta=None, impl=a.impl)

    def _append(self, k, v, k_ring=None):
        """Raw `k` to the unfinished block; `k_ring` (default `k`) to the local ring."""
        self.pending.append(k, v)
        return self.local.extend(k if k_ring is None else k_ring, v)

    def _admit(self, num_cells: int) -> None:
        """The cells `[num_cells_before, num_cells)` (the block just finished) become candidates."""
        s, fresh = self.cell_size, num_cells - self.num_cells
        new_k, new_v = self.pending.view(0, fresh * s)
        bsz, _, heads, dim = new_k.shape
        kbar, a = cell_summaries(new_k, s)  # B F H d, B F H

        def head_major(x):  # B F s H d -> B H F s d
            return x.reshape(bsz, fresh, s, heads, dim).permute(0, 3, 1, 2, 4)

        new = FSLState(cells=torch.arange(self.num_cells, num_cells, device=a.device).expand(bsz, heads, -1),
                       a=a.transpose(1, 2), kbar=kbar.transpose(1, 2), keys=head_major(new_k), values=head_major(new_v))
        self.state = admit_fsl(self.state, new, retained=self.retained, recent=self.recent)
        self.pending.clear()  # the block's positions now live in the candidates (or are dropped)
        self.num_cells = num_cells

    def _route(self, q: torch.Tensor, start: int):
        """Eq. 7 over the candidates: the choice `[B, n, H, K]` (positions into them), their raw keys and
        values `[B, H, M, s, d]`, and their cell ids `[B, H, M]`."""
        st = self.state
        if self.candidates is None:
            self.candidates = block_candidates(st.kbar, st.a, self._centers(st.cells, st.a),
                                               st.valid(self.num_cells, self.recent), self.prior)
        return self.candidates.route(q, start, self.top_k), st.keys, st.values, st.cells

    @property
    def nbytes(self) -> int:
        state = 0 if self.state is None else tensor_bytes(*self.state.tensors().values())
        return self.local.nbytes + self.pending.nbytes + state
