"""Incremental decoding: a key/value cache that stands in for the earlier positions.

`with decode_cache(model) as cache:` gives a cache for one batch of sequences.
`cache.forward(tokens)` runs only the NEW tokens `[B, n]` at positions
`[cache.length, cache.length + n)` and returns their final hidden states; the first
call is the prefill (the whole prompt), later calls usually one token.

The cache is a `KeySource` (`fsframework.models.context`): every attention layer
runs its one offset form, and the cache supplies the keys of the earlier positions.
What it keeps per layer is the kind's registry entry's business: every key for the
kinds that read the whole prefix (TF++ keys are stored already rotated; FreeSolo
keeps unrotated keys for its routing), the last `window` keys for windowed kinds
(SWA: a bounded cache).

Cost per decoded token: O(T) for full attention and FreeSolo (the routing scores
every prefix cell), O(window) for SWA; memory linear in T (bounded for SWA).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn


class DecodeCache:
    """Keys/values per layer, plus the number of positions already processed."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.length = 0
        self.key_cache: dict[int, torch.Tensor] = {}
        self.value_cache: dict[int, torch.Tensor] = {}

    @property
    def start(self) -> int:
        """Position of the first token of the current `forward` call."""
        return self.length

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `k, v` `[B, n, H, d]` to layer `layer` and return everything cached for it,
        new positions included. With a `span`, only the last `span` positions are kept for the
        next call (the returned tensors are not trimmed)."""
        if layer in self.key_cache:
            k = torch.cat((self.key_cache[layer], k), dim=1)
            v = torch.cat((self.value_cache[layer], v), dim=1)
        self.key_cache[layer], self.value_cache[layer] = _last(k, span), _last(v, span)
        return k, v

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens `[B, n]` at positions `[length, length + n)` -> hidden states `[B, n, D]`."""
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be [B, n] with n >= 1, got {tuple(tokens.shape)}")
        hidden = self.model.hidden_states(tokens, self)
        self.length += tokens.shape[1]
        return hidden


def _last(x: torch.Tensor, span: Optional[int]) -> torch.Tensor:
    """The last `span` positions of `x` `[B, T, ...]` (all of them for None)."""
    return x if span is None else x[:, max(0, x.shape[1] - span):]


def supports_decode_cache(model: nn.Module) -> bool:
    """True for registry language models that are not sequence parallel."""
    from fsframework.models.attention import QKVAttention

    if getattr(model, "_sp", None) is not None:  # sequence parallel: each rank holds a slice only
        return False
    if hasattr(model, "make_decode_cache"):  # a language model with a cached form of its own (AR-GRC)
        return True
    layers = getattr(model, "layers", None)
    return (layers is not None and hasattr(model, "hidden_states")
            and all(isinstance(layer.attn, QKVAttention) for layer in layers))


@contextmanager
def decode_cache(model: nn.Module) -> Iterator[DecodeCache]:
    """A fresh cache for `model` for the duration of the block (the model itself is untouched)."""
    if not supports_decode_cache(model):
        raise TypeError(f"{type(model).__name__} has no cached decoding form (needs a registry language model "
                        "that is not sequence parallel)")
    yield model.make_decode_cache() if hasattr(model, "make_decode_cache") else DecodeCache(model)
