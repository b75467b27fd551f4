"""FS-B's decode state (docs/freesolo.md §1.8-§1.9, docs/decoding.md): FS's state with FS-B's routing
state (the forests) grown block by block instead of rebuilt per token.

Legend: B batch, H heads, d head width, s cell_size, C eligible cells, G = B H.
"""

from __future__ import annotations

import torch

from fsframework.ops.buffers import GrowingBuffer
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_decode import FSDecodeState, Routed
from fsframework.ops.fsb_search import FSBState, admit_fsb, route_fsb_block, start_fsb


class FSBDecodeState(FSDecodeState):
    """FS-B: FS's archive and summaries, and FS-B's state (`FSBState`: per batch row and head the forests
    of docs/freesolo.md §1.8, `F0` every eligible cell, `Ftau` those with `a_c >= tau_h`), which admit
    the newly eligible cells at each block boundary (`admit_fsb`) instead of being rebuilt per token.
    The archive is `O(N d)`; a token's routing (`route_fsb_block`) reads the forests and its beam's
    cells only: no pass over the C cells (the priorities are kept row-major `[G, C]` for it, appended
    at each boundary, so a token does not transpose FS's `[B, C, H]` copy)."""

    def __init__(self, cfg: FreeSoloConfig):
        super().__init__(cfg)
        self.state: FSBState | None = None
        self.priorities = GrowingBuffer(dim=1)  # a `[G, C]`, rows g = (b, h)
        self.prior_rows: RoutingPrior | None = None  # sigma, lam `[G]`, built by the first route

    def admit(self, num_cells: int, cfg: FreeSoloConfig, prior: RoutingPrior) -> None:
        seen = self.num_cells
        super().admit(num_cells, cfg, prior)  # summaries of the new cells
        kbar, a = self.summaries.view(seen, num_cells)  # B n H d, B n H
        bsz, _, heads, dim = kbar.shape
        if self.state is None:  # the thresholds of the first block hold for life (a copy: the layer's buffer may move)
            tau = None if prior.tau is None else prior.tau.detach().clone()
            self.state = start_fsb(tau, cfg.forests, bsz, heads, dim, like=a)
        ids = torch.arange(seen, num_cells, device=a.device)
        # rows g = (b, h), as the whole-sequence search's
        a_rows = a.transpose(1, 2).flatten(0, 1)
        self.priorities.append(a_rows)
        self.state = admit_fsb(self.state, kbar.transpose(1, 2).flatten(0, 1), a_rows, self.centers(ids, a, cfg), ids)

    def route(self, q: torch.Tensor, start: int, cfg: FreeSoloConfig, prior: RoutingPrior) -> Routed:
        bsz, num, heads, dim = q.shape
        a = self.priorities.view()[0]  # G C
        acc = a.dtype
        if self.prior_rows is None:  # per row g = (b, h), once: the batch, heads and dtype are the state's for life
            self.prior_rows = RoutingPrior(*prior.per_head(heads, like=a, batch=bsz))
        q_g = q.detach().to(acc).permute(0, 2, 1, 3).reshape(bsz * heads, num, dim)
        pos = torch.arange(start, start + num, device=q.device, dtype=acc)
        keys, values = (self.cells(x, cfg) for x in self.archive.tensors)  # B H C' s d, read in place
        with torch.no_grad():
            choice = route_fsb_block(self.state, q_g, pos, keys.flatten(0, 1), a, cfg, self.prior_rows)
        choice = choice.view(bsz, heads, num, cfg.top_k).transpose(1, 2)
        return choice, keys, values, None  # the choice is cell ids

    @property
    def nbytes(self) -> int:
        forests = 0 if self.state is None else self.state.forests.nbytes
        return super().nbytes + forests + self.priorities.nbytes
