"""Host-side helpers shared by the kernel launchers."""

from __future__ import annotations

import torch

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def next_pow2(x: int) -> int:
    """Smallest power of two >= x (Triton tiles need power-of-two extents)."""
    return 1 << max(0, int(x) - 1).bit_length()


def dot_is_ieee(dtype: torch.dtype) -> bool:
    """fp32 inputs get exact fp32 products; half types use the tensor-core path."""
    return dtype == torch.float32


def check_head_dim(name: str, x: torch.Tensor, even: bool = False) -> None:
    """Raise ValueError unless `x` has a supported dtype and head dim."""
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    d = x.shape[-1]
    if d < 1 or d > 256:
        raise ValueError(f"{name}: head dim must be in [1, 256], got {d}")
    if even and d % 2:
        raise ValueError(f"{name}: RoPE needs an even head dim, got {d}")
