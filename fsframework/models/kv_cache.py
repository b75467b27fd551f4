"""Key/value caches of the attention kinds that read keys only (docs/decoding.md).

`PrefixKVCache` and `WindowKVCache` are the layer caches the registry names for the kinds
whose offset form reads the whole prefix or a window of it (`fsframework.models.registry`),
made of the buffers of `fsframework.ops.buffers`.
"""

from __future__ import annotations

import torch
from torch import nn

from fsframework.ops.buffers import GrowingBuffer, WindowKV


class PrefixKVCache:
    """Layer cache of a kind that reads the whole prefix (TF++, ALiBi, sinusoidal, rewired):
    every key and value, as the layer's `project` produced them (RoPE kinds: already rotated)."""

    def __init__(self, module: nn.Module):
        self.kv = GrowingBuffer()

    def keys(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.append(k, v)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


class WindowKVCache:
    """Layer cache of a windowed kind (SWA): a ring of the `key_span` positions its offset form reads,
    as the layer hands them (SWA: rotated once, before they enter; `DecodeCache.keeps_keys`)."""

    def __init__(self, module: nn.Module):
        if module.key_span is None:
            raise ValueError(f"{type(module).__name__} reads the whole prefix: it needs a PrefixKVCache")
        self.kv = WindowKV(module.key_span)

    def keys(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.extend(k, v)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes
