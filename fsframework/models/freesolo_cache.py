"""Decode caches of FreeSolo layers (docs/freesolo.md §1.9, docs/decoding.md).

Legend: B batch, H heads, d head width, s cell_size, Bq block_size, w window, P retained
cells, W recent cells, C cells eligible so far.

The caches compute a layer's two branches one query block at a time (a prefill chunk that
crosses blocks is run block by block), so the queries of a piece share one available set,
which changes only when a piece starts a new block. Then the cells
completed since the last boundary become eligible: their summaries (mean key `kbar`,
largest key norm `a`) are computed once, from their raw keys.

- `FSCache` (FS): every raw key/value (grown geometrically) and the summaries of every
  eligible cell; a query scores all of them (`O(C)` per token, as the routing does).
- `FSBCache` (FS-B, `fsframework.models.fsb_cache`): FS's summaries, the raw keys/values
  head-major, and per batch row and head the forests of docs/freesolo.md §1.8, grown at each
  boundary with the new cells.
- `FSLCache` (FS-L): the local window (a ring of `w` keys, rotated once when they enter),
  the unfinished block (`Bq` raw keys), and per head the candidate cells of the current
  block: the retained set (the `P` cells of largest `a` seen so far, merged with the newly
  eligible cells at each boundary) and the `W` most recent eligible cells, with their raw
  keys/values and summaries. Its size, the keys and values of `w + Bq + (P + W) s`
  positions, does not depend on the context.

All give the logits of a full forward pass (tests/models/test_decode_cache.py): the same
cells are scored by the same formula (`fsframework.ops.freesolo_cache`).
"""

from __future__ import annotations

import torch
from torch import nn

from fsframework.models.kv_cache import GrowingKV, WindowKV, tensor_bytes
from fsframework.ops.freesolo_cache import read_candidates, route_candidates
from fsframework.ops.freesolo_routing import cell_summaries
from fsframework.ops.offset_attention import window_attention_at
from fsframework.ops.rope import rotate


class _FreeSoloLayerCache:
    """What the FreeSolo caches share: the piece checks, the local branch and the long-range read."""

    def __init__(self, module: nn.Module):
        a = module.cfg.attention
        self.window, self.cell_size, self.block_size = a.window, a.cell_size, a.block_size
        self.num_cells = 0  # cells eligible for the current block: c < num_cells
        self.length = 0
        self.top_k = a.top_k
        self.selected: torch.Tensor | None = None

    def branches(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Unrotated q, k, v `[B, n, H, d]` of positions `[start, start + n)` -> (local, LR) `[B, n, H, d]`.

        A piece that crosses query blocks (a prefill chunk) is run block by block."""
        if start != self.length:
            raise ValueError(f"the cache holds {self.length} positions, got a piece starting at {start}")
        ends = list(range(start - start % self.block_size + self.block_size, start + q.shape[1], self.block_size))
        if not ends:
            return self._block_branches(module, q, k, v, start)
        outs, at = [], 0
        for stop in ends + [start + q.shape[1]]:
            piece = slice(at, stop - start)
            outs.append(self._block_branches(module, q[:, piece], k[:, piece], v[:, piece], start + at))
            at = stop - start
        return torch.cat([o[0] for o in outs], dim=1), torch.cat([o[1] for o in outs], dim=1)

    def _block_branches(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`branches` for a piece inside one query block: its queries share one available set."""
        n = q.shape[1]
        block = start - start % self.block_size
        if block // self.cell_size > self.num_cells:
            self._admit(block // self.cell_size)  # a new block: its eligible prefix moves
        a = module.cfg.attention
        local = self._local(q, k, v, start, a)
        self.length += n
        if self.num_cells == 0:  # the first block reads nothing long range: exactly 0, as in the full form
            self.selected = torch.full((*q.shape[:3], self.top_k), -1, dtype=torch.long, device=q.device)
            return local, torch.zeros_like(q)
        choice, cells_k, cells_v = self._route(module, q, start)
        # the piece's selected cells `[B, n, H, K]` (-1 = none), kept for diagnostics and the tests
        self.selected = torch.where(choice >= 0, self._cell_ids(choice), -1)
        long_range = read_candidates(q, cells_k, cells_v, choice, rms_weight=module.readout_gain())
        return local, long_range

    def _local(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, a) -> torch.Tensor:
        """Cache the piece's keys; its local branch (docs/freesolo.md §1.2) over the cached window."""
        k_local, v_local = self._append(k, v)
        return window_attention_at(q, k_local, v_local, start, window=a.window, rope_theta=a.rope_theta,
                                   impl=a.impl)

    def _route(self, module: nn.Module, q: torch.Tensor, start: int):
        """The piece's choice `[B, n, H, K]` (positions into the candidate cells, -1 = none) and the
        candidates' raw keys and values `[B, H, M, s, d]`: Eq. 7 over the cached summaries."""
        kbar, a_c, centers, valid, cells_k, cells_v = self._candidates()
        choice = route_candidates(q, start, kbar, a_c, centers, valid, top_k=self.top_k, sigma=module.sigma,
                                  lam=module.lam)
        return choice, cells_k, cells_v

    def _centers(self, cells: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return (cells.to(like.dtype) + 0.5) * self.cell_size


class FSCache(_FreeSoloLayerCache):
    """FS: the raw key/value archive plus the summaries of every eligible cell."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        self.kv = GrowingKV()
        self.kbar: torch.Tensor | None = None  # B C H d (grown geometrically)
        self.a: torch.Tensor | None = None  # B C H

    def _append(self, k, v):
        keys, values = self.kv.append(k, v)
        low = max(0, self.length - self.window)
        return keys[:, low:], values[:, low:]

    def _keys(self, low: int, high: int) -> torch.Tensor:
        """Cached keys of positions `[low, high)`, `[B, high - low, H, d]`."""
        return self.kv.view()[0][:, low:high]

    def _admit(self, num_cells: int) -> None:
        kbar, a = cell_summaries(self._keys(self.num_cells * self.cell_size, num_cells * self.cell_size),
                                 self.cell_size)
        if self.kbar is None or num_cells > self.kbar.shape[1]:
            capacity = max(num_cells, 2 * (0 if self.kbar is None else self.kbar.shape[1]))
            grown_kbar = kbar.new_empty((kbar.shape[0], capacity, *kbar.shape[2:]))
            grown_a = a.new_empty((a.shape[0], capacity, a.shape[2]))
            if self.kbar is not None:
                grown_kbar[:, :self.num_cells] = self.kbar[:, :self.num_cells]
                grown_a[:, :self.num_cells] = self.a[:, :self.num_cells]
            self.kbar, self.a = grown_kbar, grown_a
        self.kbar[:, self.num_cells:num_cells], self.a[:, self.num_cells:num_cells] = kbar, a
        self.num_cells = num_cells

    def _candidates(self):
        num, s = self.num_cells, self.cell_size
        kbar, a = self.kbar[:, :num].transpose(1, 2), self.a[:, :num].transpose(1, 2)  # B H C (d)
        centers = self._centers(torch.arange(num, device=a.device), a)
        keys, values = self.kv.view()
        bsz, _, heads, dim = keys.shape

        def cells(x):  # a view: B H C s d over the token-major archive
            return x[:, :num * s].view(bsz, num, s, heads, dim).permute(0, 3, 1, 2, 4)

        return kbar, a, centers, None, cells(keys), cells(values)

    def _cell_ids(self, choice: torch.Tensor) -> torch.Tensor:
        return choice  # candidates are every eligible cell, in order

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + tensor_bytes(self.kbar, self.a)


class FSLCache(_FreeSoloLayerCache):
    """FS-L: local window, unfinished block, and per head the block's candidate cells (retained + recent)."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        a = module.cfg.attention
        self.retained, self.recent = a.retained_cells, a.recent_cells
        self.local = WindowKV(self.window)
        self.pending_k: torch.Tensor | None = None  # B Bq H d: positions [num_cells * s, length)
        self.pending_v: torch.Tensor | None = None
        # candidates of the current block, per head, in cell order: the retained cells first
        # (`num_kept` of them, ascending), then the recent ones; see `_candidates`
        self.cells: torch.Tensor | None = None  # B H M cell indices
        self.kbar = self.a = self.cells_k = self.cells_v = None  # B H M d, B H M, B H M s d (x2)
        self.num_kept = 0

    def _local(self, q, k, v, start, a):
        # the ring serves only the local branch: it keeps its keys rotated, once, when they enter, so a
        # token does not re-rotate the whole window (the same rotation as the op's: the same numbers);
        # the cells keep the raw keys (`pending_k`), which routing and readout read unrotated
        if a.rope_theta is None:
            return super()._local(q, k, v, start, a)
        q, k_rot = rotate(q, a.rope_theta, start), rotate(k, a.rope_theta, start)
        k_local, v_local = self._append(k, v, k_rot)
        return window_attention_at(q, k_local, v_local, start, window=a.window, rope_theta=None, impl=a.impl)

    def _append(self, k, v, k_ring=None):
        """Raw `k` to the unfinished block; `k_ring` (default `k`) to the local ring."""
        if self.pending_k is None:
            shape = (k.shape[0], self.block_size, *k.shape[2:])
            self.pending_k, self.pending_v = k.new_empty(shape), v.new_empty(shape)
        at = self.length - self.num_cells * self.cell_size
        self.pending_k[:, at:at + k.shape[1]] = k
        self.pending_v[:, at:at + k.shape[1]] = v
        return self.local.extend(k if k_ring is None else k_ring, v)

    def _admit(self, num_cells: int) -> None:
        """The cells `[num_cells_before, num_cells)` (the block just finished) become eligible."""
        s, fresh = self.cell_size, num_cells - self.num_cells
        bsz, _, heads, dim = self.pending_k.shape
        new_k = self.pending_k[:, :fresh * s]
        new_v = self.pending_v[:, :fresh * s]
        kbar, a = cell_summaries(new_k, s)  # B F H d, B F H

        def per_head(x):  # B F s H d -> B H F s d
            return x.reshape(bsz, fresh, s, heads, dim).permute(0, 3, 1, 2, 4)

        new = dict(cells=torch.arange(self.num_cells, num_cells, device=a.device).expand(bsz, heads, -1),
                   kbar=kbar.transpose(1, 2), a=a.transpose(1, 2), cells_k=per_head(new_k), cells_v=per_head(new_v))
        kept = self._part(slice(0, self.num_kept))
        # retained: top-P by `a` over the kept cells and the new ones (cell order; a stable sort
        # gives ties to the earlier cell, as the reference routing does)
        pool = {name: torch.cat((kept[name], new[name]), dim=2) for name in new} if kept else new
        if self.retained == 0:
            retained = {name: x[:, :, :0] for name, x in pool.items()}
        elif pool["cells"].shape[2] > self.retained:
            best = pool["a"].sort(dim=-1, descending=True, stable=True).indices[..., :self.retained]
            best = best.gather(-1, pool["cells"].gather(-1, best).sort(dim=-1).indices)  # back to cell order
            retained = {name: _take(x, best) for name, x in pool.items()}
        else:
            retained = pool
        # recent: the last W eligible cells (the previous recent ones and the new ones)
        recent_prev = self._part(slice(self.num_kept, None))
        both = {name: torch.cat((recent_prev[name], new[name]), dim=2) for name in new} if recent_prev else new
        recent = {name: x[:, :, max(0, x.shape[2] - self.recent):] for name, x in both.items()}
        self.num_kept = retained["cells"].shape[2]
        for name in new:
            setattr(self, name, torch.cat((retained[name], recent[name]), dim=2).contiguous())
        self.num_cells = num_cells

    def _part(self, part: slice) -> dict:
        if self.cells is None:
            return {}
        return {name: getattr(self, name)[:, :, part] for name in ("cells", "kbar", "a", "cells_k", "cells_v")}

    def _candidates(self):
        # kept cells inside the recent window are listed twice: only their recent copy is valid,
        # so the valid ones stay in cell order (kept ones all precede the recent window)
        low = max(0, self.num_cells - self.recent)
        valid = torch.ones_like(self.cells, dtype=torch.bool)
        valid[:, :, :self.num_kept] = self.cells[:, :, :self.num_kept] < low
        return (self.kbar, self.a, self._centers(self.cells, self.a), valid, self.cells_k, self.cells_v)

    def _cell_ids(self, choice: torch.Tensor) -> torch.Tensor:
        bsz, num, heads, top_k = choice.shape
        ids = self.cells[:, None].expand(bsz, num, heads, -1)
        return ids.gather(-1, choice.clamp_min(0))

    @property
    def nbytes(self) -> int:
        return self.local.nbytes + tensor_bytes(self.pending_k, self.pending_v, self.cells, self.kbar, self.a,
                                                self.cells_k, self.cells_v)


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Entries `index` `[B, H, M']` along dim 2 of `x` `[B, H, M, ...]`."""
    return x.gather(2, index.view(*index.shape, *([1] * (x.dim() - 3))).expand(*index.shape, *x.shape[3:]))
