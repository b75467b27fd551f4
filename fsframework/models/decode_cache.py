"""Incremental decoding: a key/value cache for every attention kind of the registry.

`with decode_cache(model) as cache:` swaps each attention module's class for a
cached form (the same class-swap pattern as `fsframework.parallel.parallelize`;
parameters and state dict are untouched) and restores it on exit. Inside,
`cache.forward(tokens)` runs only the NEW tokens `[B, n]` at positions
`[cache.length, cache.length + n)` and returns their final hidden states; the
first call is the prefill (the whole prompt), later calls usually one token.

Each kind attends for queries at an offset `start` exactly as its
sequence-parallel form does (`fsframework.parallel.attention`), with the cache
standing in for the all-gather:
- TF++: keys cached already rotated at their absolute positions, full causal.
- sinusoidal / ALiBi: unrotated keys, absolute-position mask / bias.
- SWA: only the last `window` keys are kept (bounded cache).
- FS / FS-L: all unrotated keys; the local branch reads the last `window` of them,
  the long-range branch routes for the query's block. The routing ops take query
  offsets at block boundaries only, so queries are front-padded with zeros back to
  the start of their block and the padded outputs dropped (at most `block_size - 1`
  extra queries per step, whose routing and readout cost is bounded).

Cost per decoded token: O(T) for full attention and FreeSolo (the routing scores
every prefix cell), O(window) for SWA; memory linear in T (bounded for SWA).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn


class DecodeCache:
    """Keys/values per layer, plus the number of positions already processed."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.length = 0
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor, keep: int | None = None):
        """Append `k, v` `[B, n, H, d]` to layer `layer` and return everything cached for it,
        new positions included. With `keep`, only the last `keep` positions are stored for the
        next call (the returned tensors are not trimmed)."""
        if layer in self.keys:
            k = torch.cat((self.keys[layer], k), dim=1)
            v = torch.cat((self.values[layer], v), dim=1)
        self.keys[layer] = k if keep is None else k[:, -keep:]
        self.values[layer] = v if keep is None else v[:, -keep:]
        return k, v

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens `[B, n]` at positions `[length, length + n)` -> hidden states `[B, n, D]`."""
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be [B, n] with n >= 1, got {tuple(tokens.shape)}")
        hidden = self.model.hidden_states(tokens, start_pos=self.length)
        self.length += tokens.shape[1]
        return hidden


class CachedRopeAttention:
    def attend(self, q, k, v):
        from fsframework.ops.rope import rotate
        from fsframework.parallel.attention import causal_attention_at

        cache: DecodeCache = self._cache
        start, theta = cache.length, self.cfg.attention.rope_theta
        k_all, v_all = cache.extend(self.layer_idx, rotate(k, theta, start), v)
        return causal_attention_at(rotate(q, theta, start), k_all, v_all, start)


class CachedNoPositionAttention:
    def attend(self, q, k, v):
        from fsframework.parallel.attention import causal_attention_at

        cache: DecodeCache = self._cache
        start = cache.length
        k_all, v_all = cache.extend(self.layer_idx, k, v)
        return causal_attention_at(q, k_all, v_all, start)


class CachedAlibiAttention:
    def attend(self, q, k, v):
        from fsframework.parallel.attention import alibi_attention_at

        cache: DecodeCache = self._cache
        start = cache.length
        k_all, v_all = cache.extend(self.layer_idx, k, v)
        return alibi_attention_at(q, k_all, v_all, start, self.slopes, self.chunk)


class CachedSlidingWindowAttention:
    def attend(self, q, k, v):
        from fsframework.parallel.attention import window_attention_at

        cache: DecodeCache = self._cache
        a = self.cfg.attention
        k_all, v_all = cache.extend(self.layer_idx, k, v, keep=a.window)
        return window_attention_at(q, k_all, v_all, cache.length, window=a.window, rope_theta=a.rope_theta,
                                   impl=a.impl)


class CachedFreeSoloAttention:
    def branches(self, x):
        from fsframework.parallel.attention import long_range_at, window_attention_at

        cache: DecodeCache = self._cache
        a = self.cfg.attention
        start = cache.length
        q, k, v = self.project(x)
        k_all, v_all = cache.extend(self.layer_idx, k, v)  # B start+n H d
        lo = max(0, start - a.window)
        local = window_attention_at(q, k_all[:, lo:], v_all[:, lo:], start, window=a.window,
                                    rope_theta=a.rope_theta, impl=a.impl)
        block_start = start - start % a.block_size
        pad = start - block_start
        q_padded = torch.cat((q.new_zeros((q.shape[0], pad, *q.shape[2:])), q), dim=1)
        long_range = long_range_at(
            q_padded, k_all, v_all, block_start, rms_weight=self.lr_norm_weight, impl=a.impl,
            variant=self.cfg.name, cell_size=a.cell_size, block_size=a.block_size, top_k=a.top_k,
            sigma=self.sigma, lam=self.lam, recent_cells=a.recent_cells, retained_cells=a.retained_cells)
        return local, long_range[:, pad:]


def _cached_forms() -> dict[type, type]:
    from fsframework.models import attention as att
    from fsframework.models.freesolo_attention import FreeSoloAttention

    return {
        att.RopeAttention: CachedRopeAttention,
        att.NoPositionAttention: CachedNoPositionAttention,
        att.AlibiAttention: CachedAlibiAttention,
        att.SlidingWindowAttention: CachedSlidingWindowAttention,
        FreeSoloAttention: CachedFreeSoloAttention,
    }


_SWAPPED: dict[type, type] = {}


def supports_decode_cache(model: nn.Module) -> bool:
    """True for registry language models whose every attention kind has a cached form."""
    forms = _cached_forms()
    layers = getattr(model, "layers", None)
    return (layers is not None and hasattr(model, "hidden_states") and getattr(model, "_sp", None) is None
            and all(type(layer.attn) in forms for layer in layers))


@contextmanager
def decode_cache(model: nn.Module) -> Iterator[DecodeCache]:
    """Swap `model`'s attention modules to their cached forms for the duration of the block."""
    if not supports_decode_cache(model):
        raise TypeError(f"{type(model).__name__} has no cached decoding form (needs a registry language model "
                        "that is not sequence parallel)")
    forms = _cached_forms()
    cache = DecodeCache(model)
    originals = []
    try:
        for layer in model.layers:
            base = type(layer.attn)
            if base not in _SWAPPED:
                _SWAPPED[base] = type(f"Cached{base.__name__}", (forms[base], base), {})
            originals.append((layer.attn, base))
            layer.attn.__class__ = _SWAPPED[base]
            layer.attn._cache = cache
        yield cache
    finally:
        for module, base in originals:
            module.__class__ = base
            del module._cache
