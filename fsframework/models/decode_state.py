"""`DecodeState`: what every model's cached decoding shares (docs/decoding.md).

A state stands in for the positions already processed. `forward(tokens [B, n])` runs only
the new tokens, at positions `[length, length + n)`, `chunk` positions at a time, and returns
their final hidden states. What a model keeps is its own: a Transformer's `DecodeCache`
(`fsframework.models.decode_cache`) keeps each attention layer's keys or cells, AR-GRC's
`ScanDecodeCache` (`fsframework.models.argrc_cache`) the roots of its completed tree blocks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import torch

# prefill positions per step: bounds the activations and the [chunk x T] attention scores of a step
PREFILL_CHUNK = 512


class DecodeState(ABC):
    """The positions processed so far (`length`) and the prefill chunk; subclasses keep the rest."""

    def __init__(self, chunk: Optional[int] = None):
        self.chunk = PREFILL_CHUNK if chunk is None else chunk
        if self.chunk < 1:
            raise ValueError(f"the prefill chunk must be >= 1 positions, got {self.chunk}")
        self.length = 0

    @property
    def start(self) -> int:
        """Position of the first token of the piece being processed."""
        return self.length

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes the state has allocated."""

    @abstractmethod
    def step(self, tokens: torch.Tensor, last_only: bool) -> torch.Tensor:
        """One piece: tokens `[B, m]` (m <= chunk) at positions `[length, length + m)` -> their hidden
        states `[B, m, E]` (`last_only`: `[B, 1, E]`); `forward` then advances `length`."""

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """tokens `[B, n]` at positions `[length, length + n)` -> hidden states `[B, n, E]`
        (`last_only`: `[B, 1, E]`, so a long prefill never holds the whole prompt's states)."""
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be [B, n] with n >= 1, got {tuple(tokens.shape)}")
        out = []
        for at in range(0, tokens.shape[1], self.chunk):
            piece = tokens[:, at:at + self.chunk]
            out.append(self.step(piece, last_only))
            self.length += piece.shape[1]
        return out[-1] if last_only else torch.cat(out, dim=1)
