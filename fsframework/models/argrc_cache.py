"""AR-GRC's cached decoding (docs/argrc.md §5): `ScanDecodeCache`, the `DecodeState` that
`ARGRCLanguageModel.decode_state` makes.

Legend: B batch, n new positions, D scan width, E embedding width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from fsframework.models.argrc_blocks import aligned_blocks, prefixes_of_slice
from fsframework.models.decode_state import DecodeState
from fsframework.ops.scan import up_sweep

if TYPE_CHECKING:  # the model imports this module to make its decode state
    from fsframework.models.argrc import ARGRCLanguageModel


class ScanDecodeCache(DecodeState):
    """Cached decoding for AR-GRC (docs/argrc.md §5): the roots of the completed dyadic blocks
    of the tokens seen so far, largest first (a binary counter: at most log2(T) + 1 of them).
    A new token pushes its leaf and merges equal-sized blocks; its prefix is the fold of the
    cell over the stack from the root value. O(log T) cell calls and memory per token.

    Several tokens at once (a prompt) run `chunk` positions at a time as a slice of the tree,
    as a sequence-parallel rank runs its slice (§6) with the stack's roots standing in for the
    earlier ranks': no step holds more than one chunk's up-sweep.
    """

    def __init__(self, model: "ARGRCLanguageModel", chunk: Optional[int] = None):
        super().__init__(chunk)
        self.model = model
        self.blocks: list[tuple[int, torch.Tensor]] = []  # (size, root [B, D]), sizes decreasing

    @property
    def nbytes(self) -> int:
        """Bytes of the stack of block roots."""
        return sum(root.numel() * root.element_size() for _, root in self.blocks)

    def _push(self, leaf: torch.Tensor) -> None:
        self.blocks.append((1, leaf))
        while len(self.blocks) >= 2 and self.blocks[-1][0] == self.blocks[-2][0]:
            (size, right), (_, left) = self.blocks.pop(), self.blocks.pop()
            self.blocks.append((2 * size, self.model.combine(left, right)))

    def _state(self, batch: int) -> torch.Tensor:
        value = self.model.identity.expand(batch, -1)
        for _, root in self.blocks:
            value = self.model.combine(value, root.to(value.dtype))
        return value

    def _slice(self, h: torch.Tensor) -> torch.Tensor:
        """Prefixes `[B, n, D]` of leaves `h` at `[length, length + n)`; the stack then covers them."""
        combine, start = self.model.combine, self.length
        known, first = {}, 0
        for size, root in self.blocks:  # the stack tiles [0, start) with aligned blocks
            known[(first, size)] = root.to(h.dtype)
            first += size
        local = aligned_blocks(start, start + h.shape[1])
        levels = [up_sweep(h[:, f - start:f - start + size], combine) for f, size in local]
        for block, lv in zip(local, levels):
            known[block] = lv[-1][:, 0]
        prefixes, root = prefixes_of_slice(combine, self.model.identity.to(h.dtype), h.shape[0], start, local, levels,
                                           known)
        self.blocks = [(size, root(f, size)) for f, size in aligned_blocks(0, start + h.shape[1])]
        return prefixes

    def step(self, tokens: torch.Tensor, last_only: bool) -> torch.Tensor:
        """tokens `[B, m]` -> hidden states `[B, m, E]` (`last_only`: `[B, 1, E]`)."""
        h = self.model.leaves(tokens)
        if h.shape[1] == 1:  # one token: push its leaf, fold the stack
            self._push(h[:, 0])
            prefixes = self._state(h.shape[0])[:, None]
        else:
            prefixes = self._slice(h)
        return self.model.readout(prefixes[:, -1:] if last_only else prefixes)
