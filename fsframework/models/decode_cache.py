"""Incremental decoding: per-layer caches that stand in for the earlier positions (docs/decoding.md).

`with decode_cache(model) as cache:` gives a cache for one batch of sequences.
`cache.forward(tokens)` runs only the NEW tokens `[B, n]` at positions
`[cache.length, cache.length + n)` and returns their final hidden states (`last_only`:
the last position's only); the first call is the prefill (the whole prompt), later calls
usually one token.

The cache is a `KeySource` (`fsframework.models.context`): every attention layer runs
its one offset form, and the layer's cache supplies the keys of the earlier positions.
What a layer keeps is the kind's registry entry's business (`AttentionKind.cache`):

- `PrefixKVCache` (TF++, ALiBi, sinusoidal, rewired): every key and value, in a buffer
  grown geometrically;
- `WindowKVCache` (SWA): a ring of the last `window` positions (SWA hands it its keys
  already rotated: `keeps_keys`);
- `FSCache`, `FSLCache` (`fsframework.models.freesolo_cache`), `FSBCache`
  (`fsframework.models.fsb_cache`): FreeSolo's raw keys and cell summaries, FS-L's bounded
  set (a size that does not depend on the context), FS-B's forests. The cache is a
  `LayerStateSource`: a FreeSolo layer asks it for its layer's cache (`layer_state`) and
  that cache for both branches (`branches`) instead of for keys.

Prefill runs in chunks of `chunk` positions through the same layer code (a FreeSolo cache
walks a chunk's query blocks in order), so no step holds more than `chunk` queries'
activations or scores, whatever the prompt's length. A language model with a cached form
of its own (its registry entry's `own_decode_cache`, AR-GRC: `make_decode_cache`) brings its own cache.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn

from fsframework.models.context import LayerStateSource

# prefill positions per step: bounds the activations and the [chunk x T] attention scores of a step
PREFILL_CHUNK = 512


class DecodeCache(LayerStateSource):
    """One cache per attention layer (built by the registry's `cache` class on first use), plus
    the number of positions already processed."""

    keeps_keys = True  # the keys handed to `keys` are kept for later steps (`KeySource.keeps_keys`)

    def __init__(self, model: nn.Module, chunk: Optional[int] = None):
        from fsframework.models.registry import attention_kind

        chunk = PREFILL_CHUNK if chunk is None else chunk
        if chunk < 1:
            raise ValueError(f"the prefill chunk must be >= 1 positions, got {chunk}")
        self.model = model
        self.length = 0
        self.chunk = chunk
        self.layer_class = attention_kind(model.cfg.name).cache_class()
        self.layers: dict[int, object] = {}

    @property
    def start(self) -> int:
        """Position of the first token of the piece being processed."""
        return self.length

    def layer_state(self, layer: int):
        """Layer `layer`'s cache, built from its attention module on first use."""
        if layer not in self.layers:
            self.layers[layer] = self.layer_class(self.model.layers[layer].attn)
        return self.layers[layer]

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `k, v` `[B, n, H, d]` to layer `layer`'s cache and return the keys its offset form
        reads (`fsframework.models.context`), new positions included."""
        return self.layer_state(layer).keys(k, v, self.start)

    @property
    def nbytes(self) -> int:
        """Bytes the caches have allocated (capacity, not just the positions in use)."""
        return sum(layer.nbytes for layer in self.layers.values())

    def pieces(self, n: int) -> Iterator[int]:
        """Lengths of the pieces that `n` new positions are run in."""
        pos, end = self.length, self.length + n
        while pos < end:
            stop = min(end, pos + self.chunk)
            yield stop - pos
            pos = stop

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """tokens `[B, n]` at positions `[length, length + n)` -> hidden states `[B, n, D]`
        (`last_only`: `[B, 1, D]`, so a long prefill never holds the whole prompt's states)."""
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be [B, n] with n >= 1, got {tuple(tokens.shape)}")
        out, at = [], 0
        for size in list(self.pieces(tokens.shape[1])):
            hidden = self.model.hidden_states(tokens[:, at:at + size], self)
            self.length += size
            at += size
            out.append(hidden[:, -1:] if last_only else hidden)
        return out[-1] if last_only else torch.cat(out, dim=1)


def cache_bytes(cache) -> int:
    """Bytes a decode cache has allocated (`DecodeCache.nbytes`, or a model's own cache's)."""
    return int(cache.nbytes)


def prefill(cache, tokens: torch.Tensor) -> torch.Tensor:
    """Run `tokens` `[B, n]` through `cache`; the last position's hidden state `[B, D]`."""
    return cache.forward(tokens, last_only=True)[:, -1]


def supports_decode_cache(model: nn.Module) -> bool:
    """True for registry language models that are not sequence parallel."""
    from fsframework.models.attention import QKVAttention
    from fsframework.models.registry import kind_of

    if getattr(model, "_sp", None) is not None:  # sequence parallel: each rank holds a slice only
        return False
    kind = kind_of(model)
    if kind is None:
        return False
    return kind.own_decode_cache or all(isinstance(layer.attn, QKVAttention) for layer in model.layers)


@contextmanager
def decode_cache(model: nn.Module, chunk: Optional[int] = None) -> Iterator[DecodeCache]:
    """A fresh cache for `model` for the duration of the block (the model itself is untouched);
    `chunk`: prefill positions per step (default `PREFILL_CHUNK`)."""
    from fsframework.models.registry import kind_of

    if not supports_decode_cache(model):
        raise TypeError(f"{type(model).__name__} has no cached decoding form (needs a registry language model "
                        "that is not sequence parallel)")
    yield model.make_decode_cache(chunk) if kind_of(model).own_decode_cache else DecodeCache(model, chunk)
