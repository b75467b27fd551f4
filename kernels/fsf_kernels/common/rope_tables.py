"""RoPE cos/sin tables (half-split convention, as in Llama), shared by the kernels and the references.

Torch only (no Triton import). Angles are computed in fp64 and rounded to the
requested dtype, so long positions keep their accuracy.

`rope_rows` (the `[T, D/2]` tables of the kernels and references) and `rope_rotation_rows`
(the `[T, 1, D]` tables of `fsframework.ops.rope.rotate`) serve the rows of consecutive
positions from one table per (layout, head dim, base, dtype, device), grown by doubling when a
call reaches past its end, instead of building the rows again on every call: building them is
ten small ops (two aranges, the frequencies, the fp64 angles, cos, sin, two casts), which a
decoded token paid in every layer and a training step in every attention call (at batch 1 on a
GPU, a step's time is the host's time to issue its ops). A row depends only on its position,
so the served rows equal freshly built ones bit for bit. Memory: fp32 tables of both layouts
hold 3 D floats per position (768 B at d = 64: 192 MiB at 256k positions, up to twice that
after a doubling).
"""

from __future__ import annotations

import torch


def rope_cos_sin(
    positions: torch.Tensor, dim: int, theta: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables `[T, dim/2]` for integer `positions` `[T]` (angles in fp64, rounded to `dtype`)."""
    if dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {dim}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


# (layout, dim, theta, dtype, device) -> the tables of positions 0 .. capacity-1
_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_FIRST_CAPACITY = 4096


def _cached_rows(layout: str, start: int, length: int, dim: int, theta: float, dtype: torch.dtype,
                 device: torch.device | str, build) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `start .. start+length-1` of the tables `build(positions)` of `layout`, served from the
    cached tables of positions 0 .. capacity-1, grown by doubling."""
    if length < 0:
        raise ValueError(f"RoPE rows need length >= 0, got {length}")
    if start < 0:  # positions before 0 are no table's rows: built as asked
        return build(torch.arange(start, start + length, device=device))
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (layout, dim, float(theta), dtype, device)
    end = start + length
    table = _TABLES.get(key)
    if table is None or table[0].shape[0] < end:
        capacity = max(end, _FIRST_CAPACITY, 2 * table[0].shape[0] if table is not None else 0)
        # built outside inference mode: a table first asked for by an evaluation or a decode must
        # still be savable for a later training step's backward
        with torch.inference_mode(False), torch.no_grad():
            table = build(torch.arange(capacity, device=device))
        _TABLES[key] = table
    first, second = table
    return first[start:end], second[start:end]


def rope_rows(start: int, length: int, dim: int, theta: float, dtype: torch.dtype,
              device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin `[length, dim/2]` for positions `start .. start+length-1`: contiguous views of the
    cached table (read-only: callers must not write into them), equal to `rope_cos_sin`'s rows."""
    return _cached_rows("half", start, length, dim, theta, dtype, device,
                        lambda pos: rope_cos_sin(pos, dim, theta, dtype))


def _rotation_tables(positions: torch.Tensor, dim: int, theta: float,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rope_cos_sin(positions, dim, theta, dtype)
    return torch.cat((cos, cos), -1)[:, None], torch.cat((-sin, sin), -1)[:, None]


def rope_rotation_rows(start: int, length: int, dim: int, theta: float, dtype: torch.dtype,
                       device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables of the rotation in one multiply-add, `[length, 1, dim]` each for positions
    `start .. start+length-1`: `(cos, cos)` and `(-sin, sin)` side by side, so that
    `x * cos2 + swap_halves(x) * sin2` is `(x1 cos - x2 sin, x1 sin + x2 cos)` exactly (negation is
    exact and addition commutes), in half the ops of the four products and a concatenation."""
    return _cached_rows("rotation", start, length, dim, theta, dtype, device,
                        lambda pos: _rotation_tables(pos, dim, theta, dtype))


def rope_tables(seq: int, dim: int, theta: float, start: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous fp32 cos/sin tables `[T, D/2]` for positions start .. start+T-1."""
    return rope_rows(start, seq, dim, theta, torch.float32, device)


def rotate_at(x: torch.Tensor, theta: float, positions: torch.Tensor) -> torch.Tensor:
    """Apply RoPE to `x` `[B, T, H, D]` at the positions `positions` `[B, T]`, each `< T` (packed
    documents: each token's position inside its document): `fsframework.ops.rope.rotate`'s numbers
    for each token at its position, bit for bit (the rows of the same cached tables, gathered). Here,
    with the tables, so the kernels' wrappers (torch and triton only) rotate the same way."""
    if positions.shape != x.shape[:2]:
        raise ValueError(f"positions must be [B, T] = {list(x.shape[:2])}, got shape {tuple(positions.shape)}")
    acc = torch.promote_types(x.dtype, torch.float32)
    cos2, sin2 = rope_rotation_rows(0, x.shape[1], x.shape[-1], theta, acc, x.device)  # positions < T
    cos2, sin2 = cos2[:, 0][positions][:, :, None], sin2[:, 0][positions][:, :, None]
    xf, half = x.to(acc).view_as(x), x.shape[-1] // 2
    swapped = torch.cat((xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos2 + swapped * sin2).to(x.dtype)
