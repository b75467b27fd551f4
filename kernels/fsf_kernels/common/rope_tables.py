"""RoPE cos/sin tables (half-split convention, as in Llama), shared by the kernels and the references.

Torch only (no Triton import). Angles are computed in fp64 and rounded to the
requested dtype, so long positions keep their accuracy.
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


def rope_tables(seq: int, dim: int, theta: float, start: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous fp32 cos/sin tables `[T, D/2]` for positions start .. start+T-1."""
    pos = torch.arange(start, start + seq, device=device)
    cos, sin = rope_cos_sin(pos, dim, theta, torch.float32)
    return cos.contiguous(), sin.contiguous()
