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
- FreeSolo's decode states (`FSDecodeState`, `FSLDecodeState`, `FSBDecodeState`,
  `fsframework.ops.freesolo_decode`, `fsb_decode`): raw keys and cell summaries, FS-L's bounded
  set (a size that does not depend on the context), FS-B's forests. The cache is a
  `LayerStateSource`: asked by a FreeSolo layer for its keys and state (`freesolo_state`), it
  hands its layer's decode state (`layer_state`) to the FreeSolo op
  (`fsframework.ops.freesolo_driver.freesolo`), which advances it.

Prefill runs in chunks of `chunk` positions through the same layer code (a FreeSolo cache
walks a chunk's query blocks in order), so no step holds more than `chunk` queries'
activations or scores, whatever the prompt's length. Every language model makes its own
decode state (`LanguageModel.decode_state`): a Transformer this cache, AR-GRC its
`ScanDecodeCache` (`fsframework.models.argrc_cache`); both are `DecodeState`s
(`fsframework.models.decode_state`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from fsframework.models.context import LayerStateSource
from fsframework.models.decode_state import PREFILL_CHUNK, DecodeState
from fsframework.models.language_model import LanguageModel


class DecodeCache(DecodeState, LayerStateSource):
    """One cache per attention layer (built by the kind's `layer_cache` on first use), plus
    the number of positions already processed."""

    keeps_keys = True  # the keys handed to `keys` are kept for later steps (`KeySource.keeps_keys`)

    def __init__(self, model: nn.Module, layer_cache: Callable, chunk: Optional[int] = None):
        super().__init__(chunk)
        self.model = model
        self.layer_cache = layer_cache  # the registry entry's `cache_class()`: attention module -> layer cache
        self.layers: dict[int, object] = {}

    def layer_state(self, layer: int):
        """Layer `layer`'s cache, built from its attention module on first use."""
        if layer not in self.layers:
            self.layers[layer] = self.layer_cache(self.model.layers[layer].attn)
        return self.layers[layer]

    def keys(self, layer: int, k: torch.Tensor, v: torch.Tensor,
             span: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `k, v` `[B, n, H, d]` to layer `layer`'s cache and return the keys its offset form
        reads (`fsframework.models.context`), new positions included."""
        return self.layer_state(layer).keys(k, v, self.start)

    def freesolo_state(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span, routed):
        """A FreeSolo layer's keys and values as given, and its decode state (`fsframework.ops.freesolo_decode`),
        checked to continue at this step's start; the FreeSolo op advances it (`KeySource.freesolo_state`).
        Decoding routes with the op itself: a layer's `router` hook serves whole-sequence forwards."""
        return k, v, self.layer_state(layer).at(self.start)

    @property
    def nbytes(self) -> int:
        """Bytes the caches have allocated (capacity, not just the positions in use)."""
        return sum(layer.nbytes for layer in self.layers.values())

    def step(self, tokens: torch.Tensor, last_only: bool) -> torch.Tensor:
        hidden = self.model.hidden_states(tokens, self)
        return hidden[:, -1:] if last_only else hidden


def cache_bytes(cache: DecodeState) -> int:
    """Bytes a decode state has allocated (`DecodeState.nbytes`)."""
    return int(cache.nbytes)


def prefill(cache: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
    """Run `tokens` `[B, n]` through `cache`; the last position's hidden state `[B, D]`."""
    return cache.forward(tokens, last_only=True)[:, -1]


def supports_decode_cache(model: nn.Module) -> bool:
    """True for registry language models that are not sequence parallel."""
    return isinstance(model, LanguageModel) and model.decodable()


@contextmanager
def decode_cache(model: nn.Module, chunk: Optional[int] = None) -> Iterator[DecodeState]:
    """A fresh decode state of `model` for the duration of the block (the model itself is untouched);
    `chunk`: prefill positions per step (default `PREFILL_CHUNK`)."""
    if not supports_decode_cache(model):
        raise TypeError(f"{type(model).__name__} has no cached decoding form (needs a registry language model "
                        "that is not sequence parallel)")
    yield model.decode_state(PREFILL_CHUNK if chunk is None else chunk)
