"""Building blocks shared by every model: RMSNorm, SwiGLU, sinusoidal table, ALiBi slopes.

Legend: B batch, T time, D model width, H heads, Dh head width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 for stability under bf16
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


def dropout(p: float) -> nn.Module:
    """`model.dropout` as a module: Identity when 0, so a model without dropout draws no random numbers."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


def sinusoidal_table(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani et al. absolute position table `[..., dim]` for integer positions `[...]` (`[T]`, or
    `[B, T]` when positions restart at each packed document)."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.float()[..., None] * freq
    table = torch.cat((angles.sin(), angles.cos()), dim=-1)
    if dim % 2:
        table = F.pad(table, (0, 1))
    return table


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Press et al. head slopes: geometric sequence 2^(-8/n), interleaved for non powers of two."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return torch.tensor(power_of_two(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(power_of_two(closest) + extra)
