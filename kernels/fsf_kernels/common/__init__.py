"""Tiles and host helpers shared by the fsf_kernels ops.

`args` (argument checks), `rope_tables` (RoPE cos/sin) and `tree_tables` (the gathers of a
packed tree scan) import torch only; the other modules import Triton. Nothing is imported
eagerly here, so those three load without Triton; the helpers of `utils` are still reachable as attributes of this package.
"""

from __future__ import annotations

import importlib

__all__ = ["check_head_dim", "dot_args", "interpreting", "next_pow2"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("fsf_kernels.common.utils"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
