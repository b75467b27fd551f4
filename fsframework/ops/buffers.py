"""Growable and ring buffers of keys, values and cell summaries: what decode states are made of
(docs/decoding.md).

Legend: B batch, n new positions, H heads, d head width, w window.

- `GrowingBuffer`: every position (or cell), in buffers preallocated and grown geometrically
  (doubling), so appending a token copies nothing but the token (amortised O(1)); reads are
  views. Every growing part of a decode state is one: prefix keys/values, FreeSolo's key
  archive and cell summaries.
- `WindowKV`: a ring buffer of the last `w` positions, whose size does not depend on the
  context; a read lays the ring out in position order (a copy of `w` positions, which the
  windowed attention reads anyway).

They live with the ops because FreeSolo's decode states (`fsframework.ops.freesolo_decode`) are
ops-level state objects; the layer caches of the other kinds (`fsframework.models.kv_cache`) use
them too.
"""

from __future__ import annotations

import torch

MIN_CAPACITY = 64  # first allocation, in positions: a short prompt does not regrow at every token


def tensor_bytes(*tensors) -> int:
    """Bytes allocated by `tensors` (None counted as 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class GrowingBuffer:
    """Tensors that grow together along axis `dim` (positions or cells), preallocated and grown
    geometrically (doubling), so appending copies nothing but the new entries (amortised O(1));
    reads are views. `multiple`: the capacity is kept a multiple of it (a head-major key archive
    with a multiple of `cell_size` positions views as whole cells); `min_capacity`: the first
    allocation (a buffer that is cleared before it fills never grows past it)."""

    def __init__(self, dim: int = 1, multiple: int = 1, min_capacity: int = MIN_CAPACITY):
        self.dim, self.multiple, self.min_capacity = dim, multiple, min_capacity
        self.tensors: tuple[torch.Tensor, ...] = ()
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.tensors[0].shape[self.dim] if self.tensors else 0

    def append(self, *new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Append one tensor per buffer (same size along `dim`); return views of every entry so far."""
        end = self.length + new[0].shape[self.dim]
        if end > self.capacity:
            self._grow(new, end)
        for buffer, x in zip(self.tensors, new):
            buffer.narrow(self.dim, self.length, end - self.length).copy_(x)
        self.length = end
        return self.view()

    def _grow(self, like: tuple[torch.Tensor, ...], need: int) -> None:
        capacity = max(need, self.min_capacity, 2 * self.capacity)
        capacity = -(-capacity // self.multiple) * self.multiple
        grown = []
        for i, x in enumerate(like):
            shape = list(x.shape)
            shape[self.dim] = capacity
            buffer = x.new_empty(shape)
            if self.tensors:
                buffer.narrow(self.dim, 0, self.length).copy_(self.tensors[i].narrow(self.dim, 0, self.length))
            grown.append(buffer)
        self.tensors = tuple(grown)

    def clear(self) -> None:
        """Forget the entries; the memory is kept for the next ones."""
        self.length = 0

    def view(self, low: int = 0, high: int | None = None) -> tuple[torch.Tensor, ...]:
        """Views of entries `[low, high)` (default: all of them)."""
        high = self.length if high is None else high
        return tuple(x.narrow(self.dim, low, high - low) for x in self.tensors)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(*self.tensors)


class WindowKV:
    """The last `window` positions' keys and values in a ring `[B, window, H, d]`."""

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"a window cache needs window >= 1, got {window}")
        self.window = window
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0  # positions written so far; the ring holds the last min(length, window)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `k, v` `[B, n, H, d]`; return the up to `window` positions before them followed by
        them, `[B, min(length, window) + n, H, d]`, in position order."""
        if self.k is None:
            shape = (k.shape[0], self.window, *k.shape[2:])
            self.k, self.v = k.new_empty(shape), v.new_empty(shape)
        out = (torch.cat((*self._ordered(self.k), k), dim=1), torch.cat((*self._ordered(self.v), v), dim=1))
        keep = min(k.shape[1], self.window)  # only the last `window` new positions stay
        slots = (self.length + torch.arange(k.shape[1] - keep, k.shape[1], device=k.device)) % self.window
        self.k.index_copy_(1, slots, k[:, k.shape[1] - keep:])
        self.v.index_copy_(1, slots, v[:, v.shape[1] - keep:])
        self.length += k.shape[1]
        return out

    def _ordered(self, ring: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The ring's positions, oldest first, as views (one copy when they are concatenated)."""
        if self.length <= self.window:
            return (ring[:, :self.length],)
        head = self.length % self.window  # slot of the oldest position
        return ring[:, head:], ring[:, :head]

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.k, self.v)
