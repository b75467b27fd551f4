"""Runway-rewired attention (docs/rewired.md), in the offset form of `fsframework.models.attention`.

Transformer++ attention (RoPE, pre-norm block) whose logits get the runway bias of
`fsframework.ops.rewired`. The runway signal `u` is the value vectors of one head
(`model.attention.rewired.head`), which keeps working as a normal head. Because `u`
is a slice of the values, the key source that supplies the earlier keys and values
(sequence-parallel gather, decode cache) supplies the earlier `u` with them: the
mean runway's prefix mean is recomputed from those values, so neither needs extra state.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fsframework.config import ModelConfig
from fsframework.models.attention import RopeAttention
from fsframework.ops.rewired import RewiredSettings, rewired_attention


class RewiredAttention(RopeAttention):
    """Causal RoPE attention with the runway bias shared by all heads (docs/rewired.md §2-§3).

    With `model.attention.rewired.score="bilinear"` the layer owns `bmat` `[d, d]` (identity at init)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, key_span: Optional[int] = None):
        super().__init__(cfg, layer_idx, key_span)
        a = cfg.attention
        self.settings = RewiredSettings(runway=a.rewired.runway, score=a.rewired.score)
        self.head, self.impl = a.rewired.head, a.impl
        self.bmat = nn.Parameter(torch.eye(cfg.head_dim)) if a.rewired.score == "bilinear" else None

    def reset_extra_parameters(self) -> None:
        if self.bmat is not None:
            with torch.no_grad():
                self.bmat.copy_(torch.eye(self.head_dim))

    def attend(self, q, k, v, start):
        u = v[:, :, self.head]  # the re-purposed head's values at every key position
        return rewired_attention(q, k, v, u, settings=self.settings, bmat=self.bmat, impl=self.impl, q_start=start)

    def attend_documents(self, q, k, v, documents):
        """Packed rows in one call: each query keeps to its document's keys, its runway to its document's
        earlier tokens (q and k rotated at the document positions, `RopeAttention.project_documents`)."""
        u = v[:, :, self.head]
        return rewired_attention(q, k, v, u, settings=self.settings, bmat=self.bmat, impl=self.impl,
                                 positions=documents.positions)
