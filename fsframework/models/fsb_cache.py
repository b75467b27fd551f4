"""FS-B's decode cache (docs/freesolo.md §1.8-§1.9, docs/decoding.md): FS's cache with the forests
grown block by block instead of rebuilt per token.

Legend: B batch, H heads, d head width, s cell_size, T positions so far.
"""

from __future__ import annotations

import torch
from torch import nn

from fsframework.models.freesolo_cache import FSCache
from fsframework.models.kv_cache import MIN_CAPACITY, tensor_bytes
from fsframework.ops.freesolo_routing import per_head
from fsframework.ops.fsb_forest import Forests
from fsframework.ops.fsb_search import FOREST_KINDS, admit_cells, beam_search, forest_thresholds, rescore


class FSBCache(FSCache):
    """FS-B: FS's summaries, the raw keys/values head-major (`[B, H, T, d]`, so a batch row and
    head's cells are one view for the rescoring), and per batch row and head the forests of
    docs/freesolo.md §1.8 (`F0`: every eligible cell, `Ftau`: those with `a_c >= tau_h`), which
    admit the newly eligible cells at each block boundary instead of being rebuilt per token.
    The archive is `O(N d)`; a token's routing reads the forests and its beam's cells only."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        a = module.cfg.attention
        self.kinds = FOREST_KINDS[a.fsb_forests]
        tau = module.fsb_tau()  # raises by name when the thresholds were never set
        self.tau = None if tau is None else tau.detach().clone()
        self.beam_width, self.bound_c, self.top_k = a.fsb_beam_width, a.fsb_bound_c, a.fsb_top_k
        self.k_heads: torch.Tensor | None = None  # B H capacity d, capacity a multiple of s
        self.v_heads: torch.Tensor | None = None
        self.forests: Forests | None = None  # rows (batch row, head, kind), as the whole-sequence search
        self.thresholds: torch.Tensor | None = None  # each forest row's admission threshold

    def _append(self, k, v):
        end = self.length + k.shape[1]
        if self.k_heads is None or end > self.k_heads.shape[2]:
            capacity = max(end, MIN_CAPACITY, 2 * (0 if self.k_heads is None else self.k_heads.shape[2]))
            capacity = -(-capacity // self.cell_size) * self.cell_size
            shape = (k.shape[0], k.shape[2], capacity, k.shape[3])
            grown_k, grown_v = k.new_empty(shape), v.new_empty(shape)
            if self.k_heads is not None:
                grown_k[:, :, :self.length] = self.k_heads[:, :, :self.length]
                grown_v[:, :, :self.length] = self.v_heads[:, :, :self.length]
            self.k_heads, self.v_heads = grown_k, grown_v
        self.k_heads[:, :, self.length:end] = k.transpose(1, 2)
        self.v_heads[:, :, self.length:end] = v.transpose(1, 2)
        low = max(0, self.length - self.window)
        return self.k_heads[:, :, low:end].transpose(1, 2), self.v_heads[:, :, low:end].transpose(1, 2)

    def _keys(self, low: int, high: int) -> torch.Tensor:
        return self.k_heads[:, :, low:high].transpose(1, 2).contiguous()

    def _admit(self, num_cells: int) -> None:
        seen = self.num_cells
        super()._admit(num_cells)  # summaries of the new cells
        bsz, _, heads, dim = self.kbar.shape
        if self.forests is None:
            self.forests = Forests(bsz * heads * len(self.kinds), dim, dtype=self.kbar.dtype, device=self.a.device)
            self.thresholds = forest_thresholds(self.tau, heads, bsz, self.kinds, like=self.a)
        ids = torch.arange(seen, num_cells, device=self.a.device)
        # rows g = (b, h), as the search's
        admit_cells(self.forests, self.kbar[:, seen:num_cells].transpose(1, 2).flatten(0, 1),
                    self.a[:, seen:num_cells].transpose(1, 2).flatten(0, 1), self._centers(ids, self.a), ids,
                    self.thresholds)

    def _route(self, module: nn.Module, q: torch.Tensor, start: int):
        bsz, num, heads, dim = q.shape
        acc, cells, s = self.kbar.dtype, self.num_cells, self.cell_size
        like = torch.empty((), dtype=acc, device=q.device)
        head_of = torch.arange(heads, device=q.device).repeat(bsz)  # rows g = (b, h)
        lam = per_head(module.lam, heads, "lam", positive=False, like=like)[head_of]
        sigma = per_head(module.sigma, heads, "sigma", positive=True, like=like)[head_of]
        q_bh = q.detach().to(acc).permute(0, 2, 1, 3).reshape(bsz * heads, num, dim)
        forests = len(self.kinds)
        pos = torch.arange(start, start + num, device=q.device, dtype=acc)
        with torch.no_grad():
            found = beam_search(self.forests.store, self.forests.root, q_bh.repeat_interleave(forests, dim=0), pos,
                                beam_width=self.beam_width, lam=lam.repeat_interleave(forests),
                                sigma=sigma.repeat_interleave(forests), bound_c=self.bound_c)
            cand = found.view(bsz * heads, forests, num, self.beam_width).transpose(1, 2).flatten(2)
            capacity = self.k_heads.shape[2]
            choice = rescore(q_bh, self.k_heads.view(bsz * heads, capacity // s, s, dim),
                             self.a[:, :cells].transpose(1, 2).reshape(bsz * heads, cells),
                             self._centers(torch.arange(cells, device=q.device), self.a), pos, cand,
                             top_k=self.top_k, lam=lam, sigma=sigma)
        choice = choice.view(bsz, heads, num, self.top_k).transpose(1, 2)

        def cell_major(x):  # B H C s d, a view
            return x[:, :, :cells * s].view(bsz, heads, cells, s, dim)

        return choice, cell_major(self.k_heads), cell_major(self.v_heads)

    @property
    def nbytes(self) -> int:
        forests = 0 if self.forests is None else self.forests.nbytes
        return tensor_bytes(self.k_heads, self.v_heads, self.kbar, self.a) + forests
